//! The projector's compiled check of a message's events (`projections.decode`'s fast path).
//!
//! A message is a JSON array of events. The producer writes each event in its canonical form, the
//! form its chain hash is computed over (`preflight.events.canonical_json`: keys sorted by code point,
//! no whitespace, UTF-8 unescaped, only the escapes Python's `json.dumps` writes). `canonical_texts`
//! answers, for the raw message bytes, the text of each event when every one of them is already in
//! that form and its `hash` is the SHA-256 of its `prev_hash`, a newline and its text without the
//! `hash` member. Anything it cannot vouch for -- a float, a key with an escape, an integer of more
//! than 18 digits, nesting deeper than `MAX_DEPTH`, whitespace or a key out of order inside an event, a
//! hash that does not match -- is answered `None`, and the caller judges the message in Python, which
//! names the defect. So the answer is either exactly what the Python check would conclude or no answer.
//!
//! It does not validate events against their models: the caller has done that before asking.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use sha2::{Digest, Sha256};

/// The deepest nesting vouched for (an event object is level 1); deeper, the caller decides.
pub const MAX_DEPTH: usize = 64;
/// Integers of more digits than this are not vouched for: the caller's decoder may not hold them
/// exactly (below 10^18 every integer fits in 64 bits).
const MAX_DIGITS: usize = 18;
const DIGEST_HEX: usize = 64;

/// The `[start, end)` byte span of each event in `message` if every event is in canonical form and its
/// chain hash matches; else `None`.
pub fn canonical_spans(message: &[u8]) -> Option<Vec<(usize, usize)>> {
    std::str::from_utf8(message).ok()?;
    let mut at = skip_whitespace(message, 0);
    if message.get(at) != Some(&b'[') {
        return None;
    }
    at = skip_whitespace(message, at + 1);
    let mut spans = Vec::new();
    loop {
        let start = at;
        let event = top_level_object(message, start)?;
        if !hash_matches(message, start, &event) {
            return None;
        }
        spans.push((start, event.end));
        at = skip_whitespace(message, event.end);
        match message.get(at)? {
            b',' => at = skip_whitespace(message, at + 1),
            b']' => break,
            _ => return None,
        }
    }
    if skip_whitespace(message, at + 1) != message.len() {
        return None;
    }
    Some(spans)
}

/// An event object read in canonical form: where it ends, its `hash` member and its `prev_hash` value.
struct Event {
    end: usize,
    /// `[start, end)` of the `"hash":"…"` member (without the comma around it).
    hash_member: Option<(usize, usize)>,
    /// `[start, end)` of the claimed digest, inside its quotes.
    hash_value: Option<(usize, usize)>,
    /// `[start, end)` of `prev_hash`'s string, inside its quotes (no escape in it).
    prev_hash: Option<(usize, usize)>,
}

fn hash_matches(message: &[u8], start: usize, event: &Event) -> bool {
    let (Some((m0, m1)), Some((h0, h1)), Some((p0, p1))) =
        (event.hash_member, event.hash_value, event.prev_hash)
    else {
        return false;
    };
    let claimed = &message[h0..h1];
    if claimed.len() != DIGEST_HEX
        || !claimed
            .iter()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
    {
        return false;
    }
    // The hashed body is the text without the member and the comma that joins it to its neighbour.
    let (cut0, cut1) = if message[m0 - 1] == b',' {
        (m0 - 1, m1)
    } else if message[m1] == b',' {
        (m0, m1 + 1)
    } else {
        (m0, m1) // the only member: the body is `{}`
    };
    let mut hasher = Sha256::new();
    hasher.update(&message[p0..p1]);
    hasher.update(b"\n");
    hasher.update(&message[start..cut0]);
    hasher.update(&message[cut1..event.end]);
    let digest = hasher.finalize();
    hex_equals(&digest, claimed)
}

fn hex_equals(digest: &[u8], hex: &[u8]) -> bool {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    digest.iter().zip(hex.chunks_exact(2)).all(|(byte, pair)| {
        pair[0] == DIGITS[usize::from(byte >> 4)] && pair[1] == DIGITS[usize::from(byte & 0x0f)]
    })
}

fn skip_whitespace(b: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(at) {
        at += 1;
    }
    at
}

/// An event: a canonical object at the message's top level, its hash members noted.
fn top_level_object(b: &[u8], at: usize) -> Option<Event> {
    let mut event = Event {
        end: 0,
        hash_member: None,
        hash_value: None,
        prev_hash: None,
    };
    event.end = object(b, at, 1, Some(&mut event))?;
    Some(event)
}

/// A canonical value starting at `at`; where it ends.
fn value(b: &[u8], at: usize, depth: usize) -> Option<usize> {
    match b.get(at)? {
        b'{' => object(b, at, depth + 1, None),
        b'[' => array(b, at, depth + 1),
        b'"' => string(b, at).map(|(end, _)| end),
        b't' => literal(b, at, b"true"),
        b'f' => literal(b, at, b"false"),
        b'n' => literal(b, at, b"null"),
        b'-' | b'0'..=b'9' => integer(b, at),
        _ => None,
    }
}

/// A canonical object: keys without escapes, in strictly ascending byte order (which is code point
/// order, and rules out a repeated key); `event` notes the members the chain hash needs.
fn object(b: &[u8], at: usize, depth: usize, mut event: Option<&mut Event>) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut at = at + 1;
    if b.get(at)? == &b'}' {
        return Some(at + 1);
    }
    let mut previous: Option<&[u8]> = None;
    loop {
        let member = at;
        let (key_end, escaped) = string(b, at)?;
        if escaped {
            return None;
        }
        let key = &b[at + 1..key_end - 1];
        if previous.is_some_and(|p| p >= key) {
            return None;
        }
        previous = Some(key);
        if b.get(key_end)? != &b':' {
            return None;
        }
        let start = key_end + 1;
        let end = value(b, start, depth)?;
        if let Some(event) = event.as_deref_mut() {
            if key == b"hash" && b[start] == b'"' {
                event.hash_member = Some((member, end));
                event.hash_value = Some((start + 1, end - 1));
            } else if key == b"prev_hash" && b[start] == b'"' {
                if b[start + 1..end - 1].contains(&b'\\') {
                    return None;
                }
                event.prev_hash = Some((start + 1, end - 1));
            }
        }
        match b.get(end)? {
            b',' => at = end + 1,
            b'}' => return Some(end + 1),
            _ => return None,
        }
    }
}

fn array(b: &[u8], at: usize, depth: usize) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut at = at + 1;
    if b.get(at)? == &b']' {
        return Some(at + 1);
    }
    loop {
        let end = value(b, at, depth)?;
        match b.get(end)? {
            b',' => at = end + 1,
            b']' => return Some(end + 1),
            _ => return None,
        }
    }
}

/// A string as `json.dumps(..., ensure_ascii=False)` writes it: every character itself but `"`, `\`
/// and the control characters, escaped as it escapes them. Where it ends, and whether it holds an escape.
fn string(b: &[u8], at: usize) -> Option<(usize, bool)> {
    if b.get(at)? != &b'"' {
        return None;
    }
    let mut at = at + 1;
    let mut escaped = false;
    loop {
        at = plain_run(b, at);
        match *b.get(at)? {
            b'"' => return Some((at + 1, escaped)),
            b'\\' => {
                escaped = true;
                match *b.get(at + 1)? {
                    b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => at += 2,
                    b'u' => {
                        let code = b.get(at + 2..at + 6)?;
                        if code[0] != b'0' || code[1] != b'0' || !matches!(code[2], b'0' | b'1') {
                            return None;
                        }
                        let low = match code[3] {
                            c @ b'0'..=b'9' => c - b'0',
                            c @ b'a'..=b'f' => c - b'a' + 10,
                            _ => return None,
                        };
                        let char = (code[2] - b'0') * 16 + low;
                        // These have a short form (\b \t \n \f \r), which json.dumps writes instead.
                        if matches!(char, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
                            return None;
                        }
                        at += 6;
                    }
                    _ => return None, // `\/` and anything else: json.dumps never writes it
                }
            }
            0x00..=0x1f => return None,
            _ => at += 1,
        }
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Where the run of bytes at `at` that a string holds as they are (neither `"`, `\` nor a control
/// character) ends: eight bytes at a time, then byte by byte.
fn plain_run(b: &[u8], mut at: usize) -> usize {
    while let Some(chunk) = b.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        // A high bit set per byte that is zero in `quote` or `backslash`, or below 0x20 in `word`
        // (exact for a byte below 0x80; a byte from 0x80 up never sets it, as `!word` clears it).
        let special = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (word.wrapping_sub(ONES * 0x20) & !word);
        if special & HIGHS != 0 {
            break;
        }
        at += 8;
    }
    while let Some(&c) = b.get(at) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        at += 1;
    }
    at
}

fn literal(b: &[u8], at: usize, word: &[u8]) -> Option<usize> {
    (b.get(at..at + word.len())? == word).then_some(at + word.len())
}

/// An integer as Python writes one: no `+`, no leading zero, no `-0`; a fraction or an exponent (a
/// float) is not vouched for.
fn integer(b: &[u8], at: usize) -> Option<usize> {
    let negative = b[at] == b'-';
    let first = if negative { at + 1 } else { at };
    let mut end = first;
    while let Some(b'0'..=b'9') = b.get(end) {
        end += 1;
    }
    let digits = end - first;
    if digits == 0 || digits > MAX_DIGITS || (b[first] == b'0' && (digits > 1 || negative)) {
        return None;
    }
    match b.get(end) {
        Some(b'.' | b'e' | b'E') => None,
        _ => Some(end),
    }
}

// ---- the archive's envelope columns ----------------------------------------------------------------------

/// The archive's string columns read from an event's top level, in this order (`projections.rows.ARCHIVE`).
pub const STRING_FIELDS: [&str; 9] = [
    "event_id",
    "run_id",
    "event_type",
    "action_key",
    "user_id",
    "agent_id",
    "occurred_at",
    "hash",
    "prev_hash",
];
/// Its 32-bit integer columns.
pub const INTEGER_FIELDS: [&str; 2] = ["seq", "schema_version"];

/// An Arrow string column under construction: validity bits, 32-bit offsets, UTF-8 data.
#[derive(Default)]
pub struct StringColumn {
    pub validity: Vec<u8>,
    pub offsets: Vec<u8>,
    pub data: Vec<u8>,
    pub nulls: usize,
}

impl StringColumn {
    fn push(&mut self, row: usize, value: Option<&[u8]>) -> Option<()> {
        if row == 0 {
            self.offsets.extend_from_slice(&0i32.to_le_bytes());
        }
        if row.is_multiple_of(8) {
            self.validity.push(0);
        }
        match value {
            Some(text) => {
                self.data.extend_from_slice(text);
                *self.validity.last_mut()? |= 1 << (row % 8);
            }
            None => self.nulls += 1,
        }
        let end = i32::try_from(self.data.len()).ok()?;
        self.offsets.extend_from_slice(&end.to_le_bytes());
        Some(())
    }
}

/// The archive's columns of a chunk of verified events (canonical JSON texts): `STRING_FIELDS` as string
/// columns (`event_id` lower-cased), `INTEGER_FIELDS` as little-endian int32 values, and the texts
/// themselves as one more string column. `None` if an event lacks one of these members, holds another
/// kind of value in it (a string field may be null), an integer beyond 32 bits, an escape other than
/// `json.dumps` writes, or a non-ASCII `event_id`: the caller builds the columns itself.
pub fn archive_columns(texts: &[&[u8]]) -> Option<(Vec<StringColumn>, Vec<Vec<u8>>, StringColumn)> {
    let mut strings: Vec<StringColumn> = STRING_FIELDS
        .iter()
        .map(|_| StringColumn::default())
        .collect();
    let mut integers: Vec<Vec<u8>> = INTEGER_FIELDS
        .iter()
        .map(|_| Vec::with_capacity(texts.len() * 4))
        .collect();
    let mut events = StringColumn::default();
    let mut unescaped = Vec::new();
    for (row, text) in texts.iter().enumerate() {
        std::str::from_utf8(text).ok()?;
        let mut found_strings: [Option<Option<(usize, usize)>>; 9] = [None; 9];
        let mut found_integers: [Option<i32>; 2] = [None; 2];
        for_each_member(text, |key, start, end| {
            if let Some(index) = string_field(key) {
                found_strings[index] = Some(match text[start] {
                    b'"' => Some((start, end)),
                    b'n' => None,
                    _ => return false,
                });
            } else if let Some(index) = integer_field(key) {
                let Some(number) = std::str::from_utf8(&text[start..end])
                    .ok()
                    .and_then(|n| n.parse::<i32>().ok())
                else {
                    return false;
                };
                found_integers[index] = Some(number);
            }
            true
        })?;
        for (index, found) in found_strings.iter().enumerate() {
            let value = match (*found)? {
                None => None,
                Some((start, end)) => {
                    unescaped.clear();
                    unescape(&text[start + 1..end - 1], &mut unescaped)?;
                    if index == 0 {
                        if !unescaped.is_ascii() {
                            return None;
                        }
                        unescaped.make_ascii_lowercase();
                    }
                    Some(unescaped.as_slice())
                }
            };
            strings[index].push(row, value)?;
        }
        for (index, found) in found_integers.iter().enumerate() {
            integers[index].extend_from_slice(&(*found)?.to_le_bytes());
        }
        events.push(row, Some(text))?;
    }
    Some((strings, integers, events))
}

/// The position of `key` in `STRING_FIELDS` (a test holds the two to the same order).
fn string_field(key: &[u8]) -> Option<usize> {
    Some(match key {
        b"event_id" => 0,
        b"run_id" => 1,
        b"event_type" => 2,
        b"action_key" => 3,
        b"user_id" => 4,
        b"agent_id" => 5,
        b"occurred_at" => 6,
        b"hash" => 7,
        b"prev_hash" => 8,
        _ => return None,
    })
}

/// The position of `key` in `INTEGER_FIELDS`.
fn integer_field(key: &[u8]) -> Option<usize> {
    Some(match key {
        b"seq" => 0,
        b"schema_version" => 1,
        _ => return None,
    })
}

/// Calls `visit(key, value_start, value_end)` for each member of the JSON object `text` (keys without
/// escapes; any JSON value, skipped leniently: `text` is already known to be JSON). `None` if `visit`
/// refuses a member or the text is not such an object.
fn for_each_member(text: &[u8], mut visit: impl FnMut(&[u8], usize, usize) -> bool) -> Option<()> {
    if text.first()? != &b'{' {
        return None;
    }
    let mut at = 1;
    if text.get(at)? == &b'}' {
        return (at + 1 == text.len()).then_some(());
    }
    loop {
        let (key_end, escaped) = lenient_string(text, at)?;
        if escaped || text.get(key_end)? != &b':' {
            return None;
        }
        let start = key_end + 1;
        let end = skip_value(text, start)?;
        if !visit(&text[at + 1..key_end - 1], start, end) {
            return None;
        }
        match text.get(end)? {
            b',' => at = end + 1,
            b'}' => return (end + 1 == text.len()).then_some(()),
            _ => return None,
        }
    }
}

/// Where the JSON value at `at` ends, in text without whitespace (any number, any escape).
fn skip_value(b: &[u8], at: usize) -> Option<usize> {
    match b.get(at)? {
        b'"' => lenient_string(b, at).map(|(end, _)| end),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut at = at;
            loop {
                match b.get(at)? {
                    b'"' => at = lenient_string(b, at)?.0,
                    b'{' | b'[' => {
                        depth += 1;
                        at += 1;
                    }
                    b'}' | b']' => {
                        depth -= 1;
                        at += 1;
                        if depth == 0 {
                            return Some(at);
                        }
                    }
                    _ => at += 1,
                }
            }
        }
        _ => {
            let mut end = at;
            while let Some(c) = b.get(end) {
                if matches!(c, b',' | b'}' | b']') {
                    break;
                }
                end += 1;
            }
            Some(end)
        }
    }
}

/// Where the string at `at` ends, and whether it holds an escape (any escape).
fn lenient_string(b: &[u8], at: usize) -> Option<(usize, bool)> {
    if b.get(at)? != &b'"' {
        return None;
    }
    let mut at = at + 1;
    let mut escaped = false;
    loop {
        at = plain_run(b, at);
        match *b.get(at)? {
            b'"' => return Some((at + 1, escaped)),
            b'\\' => {
                escaped = true;
                at += 2;
            }
            _ => at += 1,
        }
    }
}

/// A JSON string's content with the escapes `json.dumps` writes resolved; `None` for any other escape.
fn unescape(raw: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let mut at = 0;
    while at < raw.len() {
        let next = raw[at..]
            .iter()
            .position(|&c| c == b'\\')
            .map_or(raw.len(), |p| at + p);
        out.extend_from_slice(&raw[at..next]);
        if next == raw.len() {
            break;
        }
        let (byte, width) = match *raw.get(next + 1)? {
            b'"' => (b'"', 2),
            b'\\' => (b'\\', 2),
            b'b' => (0x08, 2),
            b'f' => (0x0c, 2),
            b'n' => (b'\n', 2),
            b'r' => (b'\r', 2),
            b't' => (b'\t', 2),
            b'u' => {
                let code = std::str::from_utf8(raw.get(next + 2..next + 6)?).ok()?;
                let value = u8::from_str_radix(code, 16).ok()?; // beyond 0xff: not a control character
                if value >= 0x20 {
                    return None;
                }
                (value, 6)
            }
            _ => return None,
        };
        out.push(byte);
        at = next + width;
    }
    Some(())
}

/// The text of each event in `message` (a JSON array, as bytes) if every one is already in canonical
/// form and its chain hash matches; else None (see the module doc).
#[pyfunction]
fn canonical_texts<'py>(py: Python<'py>, message: &[u8]) -> PyResult<Option<Bound<'py, PyList>>> {
    let Some(spans) = canonical_spans(message) else {
        return Ok(None);
    };
    let texts = spans
        .iter()
        .map(|&(start, end)| PyBytes::new(py, &message[start..end]));
    Ok(Some(PyList::new(py, texts)?))
}

type Buffers<'py> = (
    Option<Bound<'py, PyBytes>>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

fn string_buffers<'py>(py: Python<'py>, column: &StringColumn) -> Buffers<'py> {
    let validity = (column.nulls > 0).then(|| PyBytes::new(py, &column.validity));
    (
        validity,
        PyBytes::new(py, &column.offsets),
        PyBytes::new(py, &column.data),
    )
}

/// The archive's columns of verified events as Arrow buffers (see `archive_columns`): a list of
/// (validity or None, offsets, data) per string field, a list of int32 values per integer field, and the
/// texts' (validity, offsets, data); or None, and the caller builds them itself.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn archive_buffers<'py>(
    py: Python<'py>,
    texts: Vec<Bound<'py, PyBytes>>,
) -> PyResult<Option<(Vec<Buffers<'py>>, Vec<Bound<'py, PyBytes>>, Buffers<'py>)>> {
    let slices: Vec<&[u8]> = texts.iter().map(|text| text.as_bytes()).collect();
    let Some((strings, integers, events)) = archive_columns(&slices) else {
        return Ok(None);
    };
    let strings = strings
        .iter()
        .map(|column| string_buffers(py, column))
        .collect();
    let integers = integers
        .iter()
        .map(|values| PyBytes::new(py, values))
        .collect();
    Ok(Some((strings, integers, string_buffers(py, &events))))
}

#[pymodule]
fn preflight_audit_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(canonical_texts, module)?)?;
    module.add_function(wrap_pyfunction!(archive_buffers, module)?)?;
    module.add("STRING_FIELDS", STRING_FIELDS.to_vec())?;
    module.add("INTEGER_FIELDS", INTEGER_FIELDS.to_vec())?;
    module.add("MAX_DEPTH", MAX_DEPTH)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(prev: &str, body: &str) -> String {
        // `body` is a canonical object whose keys sort before "hash" is inserted after "event_id".
        let digest = Sha256::digest(format!("{prev}\n{body}").as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let at = body.find(",\"prev_hash\"").expect("body has prev_hash");
        format!("{},\"hash\":\"{hex}\"{}", &body[..at], &body[at..])
    }

    #[test]
    fn a_canonical_chain_is_vouched_for() {
        let first = sealed(
            "",
            r#"{"a":1,"event_id":"x","prev_hash":"","z":[true,null,{"k":"é\n"}]}"#,
        );
        let message = format!("[{first}]");
        assert_eq!(
            canonical_spans(message.as_bytes()),
            Some(vec![(1, message.len() - 1)])
        );
    }

    #[test]
    fn the_fields_are_found_in_their_order() {
        for (index, name) in STRING_FIELDS.iter().enumerate() {
            assert_eq!(string_field(name.as_bytes()), Some(index));
        }
        for (index, name) in INTEGER_FIELDS.iter().enumerate() {
            assert_eq!(integer_field(name.as_bytes()), Some(index));
        }
        assert_eq!(string_field(b"seq"), None);
        assert_eq!(integer_field(b"hash"), None);
    }

    #[test]
    fn anything_else_is_left_to_the_caller() {
        let good = sealed("", r#"{"a":1,"event_id":"x","prev_hash":""}"#);
        for bad in [
            good.replace("\"a\":1", "\"a\":1.0"),
            good.replace("\"a\":1", "\"a\": 1"),
            good.replace("\"a\":1", "\"a\":-0"),
            good.replace("\"a\":1", "\"a\":01"),
            good.replace("\"a\":1", "\"b\":1"),
            good.replace("{\"a\":1,", "{\"a\":1,\"a\":1,"),
            good.replace("\"a\":1", "\"a\":\"\\u0041\""),
            good.replace("\"a\":1", "\"a\":\"\\/\""),
            good.replace("\"a\":1", "\"a\":1234567890123456789"),
        ] {
            assert_eq!(
                canonical_spans(format!("[{bad}]").as_bytes()),
                None,
                "{bad}"
            );
        }
        assert!(canonical_spans(format!("[{good}]").as_bytes()).is_some());
        assert!(canonical_spans(format!(" [ {good} , {good} ] ").as_bytes()).is_some());
        assert_eq!(canonical_spans(b"[]"), None);
        assert_eq!(canonical_spans(format!("[{good}]x").as_bytes()), None);
    }
}
