//! The projector's compiled check of a message's events (`projections.decode`'s fast path).
//!
//! A message is a JSON array of events. The producer writes each event in its canonical form, the
//! form its chain hash is computed over (RFC 8785 from event version 3, `preflight.events.canonical_json`
//! before: keys sorted by UTF-16 code unit or by code point, which agree for keys below U+E000; no
//! whitespace, UTF-8 unescaped, only the escapes Python's `json.dumps` writes). `canonical_texts`
//! answers, for the raw message bytes, the text of each event when every one of them is already in
//! that form, its `event_id` spells a UUID and its `hash` (64 lower-case hex digits) is the SHA-256 of
//! its `prev_hash`, a newline and its text without the `hash` member. Anything it cannot vouch for -- a
//! float, a key with an escape or a character from U+E000 up (where the two orders can differ), an
//! integer of more than 18 digits, nesting deeper than `MAX_DEPTH`, whitespace or a key out of order
//! inside an event, an event_id of another form, a hash that does not match -- is answered `None`, and
//! the caller judges the message in Python, which names the defect. So the answer is either exactly
//! what the Python check would conclude or no answer.
//!
//! It does not validate events against their models: the caller has done that before asking.

mod jcs;

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
    let events = canonical_events(message)?;
    Some(
        events
            .iter()
            .map(|event| (event.start, event.end))
            .collect(),
    )
}

/// Each event of `message` if every one is in canonical form and its chain hash matches; else `None`.
fn canonical_events(message: &[u8]) -> Option<Vec<Event>> {
    std::str::from_utf8(message).ok()?;
    let mut at = skip_whitespace(message, 0);
    if message.get(at) != Some(&b'[') {
        return None;
    }
    at = skip_whitespace(message, at + 1);
    let mut events = Vec::new();
    loop {
        let event = top_level_object(message, at)?;
        if !hash_matches(message, &event) {
            return None;
        }
        at = skip_whitespace(message, event.end);
        events.push(event);
        match message.get(at)? {
            b',' => at = skip_whitespace(message, at + 1),
            b']' => break,
            _ => return None,
        }
    }
    if skip_whitespace(message, at + 1) != message.len() {
        return None;
    }
    Some(events)
}

/// An event object read in canonical form: where it is, its `hash` member and its `prev_hash` value,
/// and the values of the archive's columns.
struct Event {
    start: usize,
    end: usize,
    /// `[start, end)` of the `"hash":"…"` member (without the comma around it).
    hash_member: Option<(usize, usize)>,
    /// `[start, end)` of the claimed digest, inside its quotes.
    hash_value: Option<(usize, usize)>,
    /// `[start, end)` of `prev_hash`'s string, inside its quotes (no escape in it).
    prev_hash: Option<(usize, usize)>,
    /// Whether its `event_id` is a string spelling a UUID.
    uuid: bool,
    /// `[start, end)` of the value of each `ARCHIVE_FIELDS` member.
    fields: [Option<(usize, usize)>; ARCHIVE_FIELDS.len()],
}

fn hash_matches(message: &[u8], event: &Event) -> bool {
    let start = event.start;
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
        start: at,
        end: 0,
        hash_member: None,
        hash_value: None,
        prev_hash: None,
        uuid: false,
        fields: [None; ARCHIVE_FIELDS.len()],
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

/// A canonical object: keys without escapes and below U+E000, in strictly ascending byte order (which is
/// code point order, and there RFC 8785's UTF-16 order too; it rules out a repeated key); `event` notes the
/// members the chain hash needs.
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
        let key = &b[at + 1..key_end - 1];
        // A key with a character from U+E000 up (UTF-8 lead byte 0xEE-0xF4) may sort apart by code point
        // and by UTF-16 code unit (RFC 8785's order): left to the caller, as escaped keys are.
        if escaped || key.iter().any(|&c| c >= 0xEE) {
            return None;
        }
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
            if let Some(field) = ARCHIVE_FIELDS
                .iter()
                .position(|(name, _)| name.as_bytes() == key)
            {
                event.fields[field] = Some((start, end));
            }
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

// ---- the archive's columns ---------------------------------------------------------------------------------

/// The archive's columns read from an event's top level, in the archive's order, and whether each is an
/// integer (INTEGER) rather than a string (VARCHAR) column.
pub const ARCHIVE_FIELDS: [(&str, bool); 11] = [
    ("event_id", false),
    ("run_id", false),
    ("seq", true),
    ("event_type", false),
    ("schema_version", true),
    ("action_key", false),
    ("user_id", false),
    ("agent_id", false),
    ("occurred_at", false),
    ("hash", false),
    ("prev_hash", false),
];

/// An Arrow string column under construction.
struct StringColumn {
    offsets: Vec<i32>,
    data: Vec<u8>,
    valid: Vec<bool>,
}

impl StringColumn {
    fn new() -> Self {
        Self {
            offsets: vec![0],
            data: Vec::new(),
            valid: Vec::new(),
        }
    }

    /// Ends the row whose bytes were appended to `data` (none for a NULL).
    fn close(&mut self, valid: bool) -> Option<()> {
        self.offsets.push(i32::try_from(self.data.len()).ok()?);
        self.valid.push(valid);
        Some(())
    }

    fn truncate(&mut self, rows: usize) {
        let rows = rows.min(self.valid.len());
        self.valid.truncate(rows);
        self.offsets.truncate(rows + 1);
        self.data.truncate(self.offsets[rows] as usize);
    }

    /// (validity bits or None when no row is NULL, 32-bit offsets, data), as Arrow lays them out.
    fn buffers<'py>(&self, py: Python<'py>) -> Buffers<'py> {
        let validity = self.valid.contains(&false).then(|| {
            let mut bits = vec![0u8; self.valid.len().div_ceil(8)];
            for (row, _) in self.valid.iter().enumerate().filter(|(_, valid)| **valid) {
                bits[row / 8] |= 1 << (row % 8);
            }
            PyBytes::new(py, &bits)
        });
        let offsets: Vec<u8> = self.offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
        (
            validity,
            PyBytes::new(py, &offsets),
            PyBytes::new(py, &self.data),
        )
    }
}

type Buffers<'py> = (
    Option<Bound<'py, PyBytes>>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

/// An Arrow string view (16 bytes) of `text`: its length, then the text itself when it is 12 bytes or
/// shorter, else its first 4 bytes, the index of the data buffer holding it and its offset there.
fn string_view(text: &[u8], buffer: i32, offset: usize) -> Option<[u8; 16]> {
    let mut view = [0u8; 16];
    view[..4].copy_from_slice(&i32::try_from(text.len()).ok()?.to_le_bytes());
    if text.len() <= 12 {
        view[4..4 + text.len()].copy_from_slice(text);
    } else {
        view[4..8].copy_from_slice(&text[..4]);
        view[8..12].copy_from_slice(&buffer.to_le_bytes());
        view[12..].copy_from_slice(&i32::try_from(offset).ok()?.to_le_bytes());
    }
    Some(view)
}

/// The archive's columns of a chunk of messages, built while their events are checked: each vouched-for
/// message's rows are appended by `canonical_texts`, any other verified event's by `push`, in the order of
/// the archive's rows; `truncate` takes back a message's rows when it is refused after all.
///
/// The events' texts are not copied: each row holds an Arrow string view of its text. A vouched-for
/// event's text is a span of its message's value, so its view points into data buffer `message` (the
/// message's position in the chunk, set before `canonical_texts` is asked); a pushed text is copied
/// into `texts`, data buffer `messages` (after every message's). The caller lays the buffers out so.
#[pyclass(module = "preflight_audit_native")]
pub struct ArchiveColumns {
    strings: Vec<StringColumn>,
    integers: Vec<Vec<i32>>,
    views: Vec<[u8; 16]>,
    texts: Vec<u8>,
    messages: i32,
    message: i32,
    indexes: Vec<i32>,
}

impl ArchiveColumns {
    fn rows(&self) -> usize {
        self.indexes.len()
    }

    /// Where a view's text starts in `texts`, if it is a pushed text not held in the view itself.
    fn pushed_at(&self, view: &[u8; 16]) -> Option<usize> {
        let length = i32::from_le_bytes(view[..4].try_into().ok()?);
        let buffer = i32::from_le_bytes(view[8..12].try_into().ok()?);
        let offset = i32::from_le_bytes(view[12..].try_into().ok()?);
        (length > 12 && buffer == self.messages).then_some(offset as usize)
    }

    /// Appends the rows of a vouched-for message; none (and `None`) if a member is missing or of another
    /// kind than its column's, or an integer beyond 32 bits: the caller then pushes them itself.
    fn append(&mut self, message: &[u8], events: &[Event]) -> Option<()> {
        let before = self.rows();
        for (index, event) in events.iter().enumerate() {
            if self.append_event(message, event, index).is_none() {
                self.truncate(before);
                return None;
            }
        }
        Some(())
    }

    fn append_event(&mut self, message: &[u8], event: &Event, index: usize) -> Option<()> {
        let (mut string, mut integer) = (0, 0);
        for (field, &(_, is_integer)) in ARCHIVE_FIELDS.iter().enumerate() {
            let (start, end) = event.fields[field]?;
            let value = &message[start..end];
            if is_integer {
                let number: i32 = std::str::from_utf8(value).ok()?.parse().ok()?;
                self.integers[integer].push(number);
                integer += 1;
                continue;
            }
            let column = &mut self.strings[string];
            string += 1;
            match value[0] {
                b'n' => column.close(false)?,
                b'"' => {
                    let from = column.data.len();
                    unescape(&value[1..value.len() - 1], &mut column.data)?;
                    if field == 0 {
                        column.data[from..].make_ascii_lowercase(); // a UUID: ASCII
                    }
                    column.close(true)?;
                }
                _ => return None,
            }
        }
        self.views.push(string_view(
            &message[event.start..event.end],
            self.message,
            event.start,
        )?);
        self.indexes.push(i32::try_from(index).ok()?);
        Some(())
    }
}

#[pymethods]
impl ArchiveColumns {
    /// The columns of a chunk of `messages` messages.
    #[new]
    fn py_new(messages: usize) -> PyResult<Self> {
        let strings = ARCHIVE_FIELDS
            .iter()
            .filter(|(_, is_integer)| !is_integer)
            .count();
        Ok(Self {
            strings: (0..strings).map(|_| StringColumn::new()).collect(),
            integers: vec![Vec::new(), Vec::new()],
            views: Vec::new(),
            texts: Vec::new(),
            messages: i32::try_from(messages).map_err(|_| too_large())?,
            message: 0,
            indexes: Vec::new(),
        })
    }

    /// The rows so far.
    #[getter(rows)]
    fn py_rows(&self) -> usize {
        self.rows()
    }

    /// The position in the chunk of the message whose rows `canonical_texts` appends next.
    #[getter(message)]
    fn py_message(&self) -> i32 {
        self.message
    }

    #[setter(message)]
    fn set_message(&mut self, message: i32) -> PyResult<()> {
        if !(0..self.messages).contains(&message) {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "message {message} of a chunk of {}",
                self.messages
            )));
        }
        self.message = message;
        Ok(())
    }

    /// Keeps the first `rows` rows only.
    fn truncate(&mut self, rows: usize) {
        for column in &mut self.strings {
            column.truncate(rows);
        }
        for column in &mut self.integers {
            column.truncate(rows);
        }
        let rows = rows.min(self.views.len());
        let pushed = self.views[rows..]
            .iter()
            .filter_map(|view| self.pushed_at(view))
            .min();
        if let Some(at) = pushed {
            self.texts.truncate(at);
        }
        self.views.truncate(rows);
        self.indexes.truncate(rows);
    }

    /// Appends one verified event's row: `values` in `ARCHIVE_FIELDS` order (a string column takes any
    /// other value as NULL; `event_id` is lower-cased), its canonical `text`, its index in its message.
    fn push(&mut self, values: Vec<Bound<'_, PyAny>>, text: &[u8], index: i32) -> PyResult<()> {
        if values.len() != ARCHIVE_FIELDS.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "one value per archive field",
            ));
        }
        let mut numbers = Vec::new();
        for (&(_, is_integer), value) in ARCHIVE_FIELDS.iter().zip(&values) {
            if is_integer {
                numbers.push(value.extract::<i32>()?);
            }
        }
        let (mut string, mut integer) = (0, 0);
        for (field, (&(_, is_integer), value)) in ARCHIVE_FIELDS.iter().zip(&values).enumerate() {
            if is_integer {
                self.integers[integer].push(numbers[integer]);
                integer += 1;
                continue;
            }
            let column = &mut self.strings[string];
            string += 1;
            let text = value
                .cast::<pyo3::types::PyString>()
                .ok()
                .map(|s| s.to_str())
                .transpose()?;
            match text {
                Some(text) if field == 0 => column
                    .data
                    .extend_from_slice(text.to_lowercase().as_bytes()),
                Some(text) => column.data.extend_from_slice(text.as_bytes()),
                None => {}
            }
            column.close(text.is_some()).ok_or_else(too_large)?;
        }
        let view = string_view(text, self.messages, self.texts.len()).ok_or_else(too_large)?;
        if self.texts.len() + text.len() > i32::MAX as usize {
            return Err(too_large());
        }
        if text.len() > 12 {
            self.texts.extend_from_slice(text); // a shorter one is held in its view
        }
        self.views.push(view);
        self.indexes.push(index);
        Ok(())
    }

    /// The columns as Arrow buffers: (validity or None, offsets, data) per string field, little-endian
    /// int32 values per integer field (both in `ARCHIVE_FIELDS` order), the texts' views and the pushed
    /// texts (data buffer `messages`), and the indexes' values.
    #[allow(clippy::type_complexity)]
    fn finish<'py>(
        &self,
        py: Python<'py>,
    ) -> (
        Vec<Buffers<'py>>,
        Vec<Bound<'py, PyBytes>>,
        (Bound<'py, PyBytes>, Bound<'py, PyBytes>),
        Bound<'py, PyBytes>,
    ) {
        let ints = |values: &[i32]| {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            PyBytes::new(py, &bytes)
        };
        (
            self.strings
                .iter()
                .map(|column| column.buffers(py))
                .collect(),
            self.integers.iter().map(|values| ints(values)).collect(),
            (
                PyBytes::new(py, self.views.as_flattened()),
                PyBytes::new(py, &self.texts),
            ),
            ints(&self.indexes),
        )
    }
}

fn too_large() -> PyErr {
    pyo3::exceptions::PyOverflowError::new_err("a chunk's archive column beyond 2 GiB")
}

/// A JSON string's content with the escapes `json.dumps` writes resolved into `out`; `None` for any other.
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
/// form and its chain hash matches; else None (see the module doc). With `columns`, the events' archive
/// rows are appended to them (or none, where one cannot be read: see `ArchiveColumns::append`).
#[pyfunction]
#[pyo3(signature = (message, columns=None))]
fn canonical_texts<'py>(
    py: Python<'py>,
    message: &[u8],
    columns: Option<PyRefMut<'py, ArchiveColumns>>,
) -> PyResult<Option<Bound<'py, PyList>>> {
    let Some(events) = canonical_events(message) else {
        return Ok(None);
    };
    if let Some(mut columns) = columns {
        let _ = columns.append(message, &events); // declined: the caller pushes the rows itself
    }
    let texts = events
        .iter()
        .map(|event| PyBytes::new(py, &message[event.start..event.end]));
    Ok(Some(PyList::new(py, texts)?))
}

#[pymodule]
fn preflight_audit_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(canonical_texts, module)?)?;
    module.add_function(wrap_pyfunction!(jcs::jcs, module)?)?;
    module.add_function(wrap_pyfunction!(jcs::jcs_sealed, module)?)?;
    module.add_function(wrap_pyfunction!(jcs::jcs_digest, module)?)?;
    module.add_function(wrap_pyfunction!(jcs::plain_json, module)?)?;
    module.add_class::<ArchiveColumns>()?;
    let fields: Vec<&str> = ARCHIVE_FIELDS.iter().map(|(name, _)| *name).collect();
    module.add("ARCHIVE_FIELDS", fields)?;
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
