//! The projector's compiled check of a message's events (`projections.decode`'s fast path).
//!
//! A message is a JSON array of events. The producer writes each event in its canonical form, the
//! form its chain hash is computed over (`preflight.events.canonical_json`: keys sorted by code point,
//! no whitespace, UTF-8 unescaped, only the escapes Python's `json.dumps` writes). `canonical_texts`
//! answers, for the raw message bytes, the text of each event when every one of them is already in
//! that form, its `event_id` spells a UUID and its `hash` (64 lower-case hex digits) is the SHA-256 of
//! its `prev_hash`, a newline and its text without the `hash` member. Anything it cannot vouch for -- a
//! float, a key with an escape, an integer of more than 18 digits, nesting deeper than `MAX_DEPTH`,
//! whitespace or a key out of order inside an event, an event_id of another form, a hash that does not
//! match -- is answered `None`, and the caller judges the message in Python, which
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
    /// Whether its `event_id` is a string spelling a UUID.
    uuid: bool,
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

/// Whether `json` is a JSON string spelling a UUID as `projections.decode` accepts one: 8-4-4-4-12 hex
/// digits of either case.
fn is_uuid(json: &[u8]) -> bool {
    json.len() == 38
        && json[0] == b'"'
        && json[37] == b'"'
        && json[1..37].iter().enumerate().all(|(at, c)| match at {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
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
        uuid: false,
    };
    event.end = object(b, at, 1, Some(&mut event))?;
    event.uuid.then_some(event)
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
            } else if key == b"event_id" {
                event.uuid = is_uuid(&b[start..end]);
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

#[pymodule]
fn preflight_audit_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(canonical_texts, module)?)?;
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
            r#"{"a":1,"event_id":"6f9619ff-8b86-d011-b42d-00C04fc964ff","prev_hash":"","z":[true,null,{"k":"é\n"}]}"#,
        );
        let message = format!("[{first}]");
        assert_eq!(
            canonical_spans(message.as_bytes()),
            Some(vec![(1, message.len() - 1)])
        );
    }

    #[test]
    fn anything_else_is_left_to_the_caller() {
        let good = sealed(
            "",
            r#"{"a":1,"event_id":"6f9619ff-8b86-d011-b42d-00C04fc964ff","prev_hash":""}"#,
        );
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
        for id in [
            "x",
            "6f9619ff-8b86-d011-b42d-00c04fc964f",
            "6f9619ff-8b86-d011-b42d_00c04fc964ff",
        ] {
            let other = sealed(
                "",
                &format!(r#"{{"a":1,"event_id":"{id}","prev_hash":""}}"#),
            );
            assert_eq!(
                canonical_spans(format!("[{other}]").as_bytes()),
                None,
                "{id}"
            );
        }
        let unnamed = sealed("", r#"{"a":1,"prev_hash":""}"#);
        assert_eq!(canonical_spans(format!("[{unnamed}]").as_bytes()), None);
        assert!(canonical_spans(format!("[{good}]").as_bytes()).is_some());
        assert!(canonical_spans(format!(" [ {good} , {good} ] ").as_bytes()).is_some());
        assert_eq!(canonical_spans(b"[]"), None);
        assert_eq!(canonical_spans(format!("[{good}]x").as_bytes()), None);
    }
}
