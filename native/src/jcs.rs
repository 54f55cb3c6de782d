//! RFC 8785 (JCS) bytes of plain Python JSON values, written in one pass (`preflight.chain.jcs`'s fast path).
//!
//! It vouches only for values whose bytes it can write exactly: dicts with `str` keys, lists, `str`,
//! 64-bit `int`, `bool` and `None`, each of its exact built-in type, nested at most `MAX_DEPTH` deep.
//! Keys are sorted by their UTF-16 code units, as RFC 8785 section 3.2.3 says; strings are escaped as
//! ECMAScript's `JSON.stringify` does (section 3.2.2.2: `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other
//! control characters as `\u00xx`, everything else as UTF-8). Anything else -- a float, a larger
//! integer, a tuple, a subclass, a lone surrogate, deeper nesting -- is answered `None`, and the caller
//! writes the value with its exact implementation, which names any defect. So the answer is either
//! the exact bytes or no answer.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use sha2::{Digest, Sha256};

/// The deepest nesting written (a top-level object or array is level 1); deeper, the caller writes it.
pub const JCS_MAX_DEPTH: usize = 128;

// The walks below read the value through CPython's C API with borrowed pointers: no `Bound` (an incref and a
// decref per dict member and list item), no vector of members per dict, no error objects built to be dropped
// -- with the word scans and the sort below, the writer went from ~1.2 to ~0.8 us an event of the engine
// bench's run, its seal from ~2.0 to ~1.45 (bench/engine_jcs.py; bench/README.md, fifteenth pass). Every pointer
// is borrowed from the value the caller passed (held by its `Bound`) and stays valid while no container in it
// changes. Nothing changes one during a walk: the GIL is held (the functions take `Python` or a `Bound`) and
// no Python code runs -- the calls below read dicts, lists, ints and strs of their exact built-in types
// (no `__hash__`, `__index__` or `__eq__` of a subclass) and allocate no object the collector tracks (only
// a str's cached UTF-8, and the answer once the walk is done), so not even a finalizer runs. The one object
// they may make is a lone surrogate's `UnicodeEncodeError` (then cleared): the walk ends there, reading no
// pointer after it.

/// A borrowed pointer into the value being walked (see above).
type Borrowed = *mut ffi::PyObject;

/// One member of a dict being written: its key, the key's first 8 bytes (zero-padded, big-endian: compared
/// as one number, they order two keys as their bytes do, unless equal), whether the key holds a character
/// from U+E000 up (a lead byte from 0xEE, where code point and UTF-16 order can differ: 1, else 0), and its
/// value. Five words, no padding: the insertion sort moves them whole (a `bool` and its padding, copied
/// piecewise, stalled the loads after them: ~0.1-0.2 us a run's 9 events).
#[derive(Clone, Copy)]
struct Member<'v> {
    key: &'v str,
    prefix: u64,
    high: u64,
    value: Borrowed,
}

impl Member<'_> {
    /// RFC 8785's order of two members' keys: by UTF-16 code units. By their UTF-8 bytes -- code point order,
    /// the same as UTF-16's -- unless both keys hold a character from U+E000 up, which `utf16_order`
    /// compares. The prefixes decide most pairs of an event's keys without a call to `memcmp` (a zero byte
    /// of padding sorts as a key's end does: below any byte but a zero, whose tie the full compare breaks).
    #[inline(always)]
    fn order(&self, other: &Self) -> std::cmp::Ordering {
        if self.high & other.high != 0 {
            return utf16_order(self.key, other.key);
        }
        self.prefix
            .cmp(&other.prefix)
            .then_with(|| self.key.as_bytes().cmp(other.key.as_bytes()))
    }
}

/// Whether `object`'s type is exactly `kind` (a subclass is not).
///
/// # Safety
/// `object` is a live object and the GIL is held.
#[inline(always)]
unsafe fn is(object: Borrowed, kind: *mut ffi::PyTypeObject) -> bool {
    ffi::Py_TYPE(object) == kind
}

/// The UTF-8 of the exact `str` `text`, or None for a lone surrogate (the error is cleared: not ours to raise).
///
/// # Safety
/// `text` is a live exact `str`, the GIL is held, and `'v` does not outlive `text`.
#[inline]
unsafe fn utf8<'v>(text: Borrowed) -> Option<&'v str> {
    let mut size: ffi::Py_ssize_t = 0;
    let data = ffi::PyUnicode_AsUTF8AndSize(text, &mut size);
    if data.is_null() {
        ffi::PyErr_Clear();
        return None;
    }
    // CPython keeps a str's UTF-8 in the object for its life, and it is valid UTF-8: a lone surrogate,
    // which is not, was refused above.
    Some(std::str::from_utf8_unchecked(std::slice::from_raw_parts(
        data.cast::<u8>(),
        size as usize,
    )))
}

/// The exact `int` `number` if it fits in 64 bits, else None.
///
/// # Safety
/// `number` is a live exact `int` and the GIL is held.
#[inline]
unsafe fn int64(number: Borrowed) -> Option<i64> {
    let mut overflow: std::os::raw::c_int = 0;
    let value = ffi::PyLong_AsLongLongAndOverflow(number, &mut overflow);
    if overflow != 0 {
        return None;
    }
    if value == -1 && !ffi::PyErr_Occurred().is_null() {
        ffi::PyErr_Clear(); // cannot happen for an exact int; cleared all the same
        return None;
    }
    Some(value)
}

/// Pushes the members of the exact `dict` onto `members`, sorted in RFC 8785's order (`Member::order`; each
/// key scanned once, not at every comparison); None where a key is not an exact `str` or is a lone
/// surrogate. One vector holds the members of every dict being written (each dict's above its parent's,
/// popped when written): no allocation per dict.
///
/// # Safety
/// `dict` is a live exact `dict`, the GIL is held, and `'v` does not outlive `dict`.
unsafe fn sorted_members<'v>(dict: Borrowed, members: &mut Vec<Member<'v>>) -> Option<()> {
    let start = members.len();
    let mut at: ffi::Py_ssize_t = 0;
    let mut key: Borrowed = std::ptr::null_mut();
    let mut value: Borrowed = std::ptr::null_mut();
    while ffi::PyDict_Next(dict, &mut at, &mut key, &mut value) != 0 {
        if !is(key, &raw mut ffi::PyUnicode_Type) {
            return None;
        }
        let key = utf8(key)?;
        members.push(Member {
            key,
            prefix: prefix(key.as_bytes()),
            high: high(key.as_bytes()) as u64,
            value,
        });
    }
    sort(&mut members[start..]);
    Some(())
}

/// Sorts `members` by `Member::order`: by insertion, its comparison inlined, up to `SMALL` members (an event's
/// dicts hold up to ~20; std's small sort called the comparison for each pair: ~0.1 us a run's 9 events
/// more), else by `sort_unstable_by`.
fn sort(members: &mut [Member<'_>]) {
    const SMALL: usize = 32;
    if members.len() > SMALL {
        members.sort_unstable_by(Member::order);
        return;
    }
    for at in 1..members.len() {
        let member = members[at];
        let mut to = at;
        while to > 0 && member.order(&members[to - 1]).is_lt() {
            members[to] = members[to - 1];
            to -= 1;
        }
        members[to] = member;
    }
}

/// Appends the JCS bytes of `value` to `out`; `None` where it does not vouch for them. `members` is the
/// dicts' shared stack of members (`sorted_members`), left as it was found.
///
/// # Safety
/// `value` is a live object, the GIL is held, and `'v` does not outlive `value`.
unsafe fn write<'v>(
    value: Borrowed,
    out: &mut Vec<u8>,
    members: &mut Vec<Member<'v>>,
    depth: usize,
) -> Option<()> {
    if is(value, &raw mut ffi::PyUnicode_Type) {
        string(utf8(value)?, out); // a lone surrogate: not vouched for
    } else if is(value, &raw mut ffi::PyLong_Type) {
        integer(int64(value)?, out);
    } else if value == ffi::Py_None() {
        out.extend_from_slice(b"null");
    } else if is(value, &raw mut ffi::PyBool_Type) {
        out.extend_from_slice(if value == ffi::Py_True() {
            b"true"
        } else {
            b"false"
        });
    } else if is(value, &raw mut ffi::PyDict_Type) {
        if depth >= JCS_MAX_DEPTH {
            return None;
        }
        let start = members.len();
        sorted_members(value, members)?;
        out.push(b'{');
        for at in start..members.len() {
            if at > start {
                out.push(b',');
            }
            let member = members[at];
            string(member.key, out);
            out.push(b':');
            write(member.value, out, members, depth + 1)?;
        }
        out.push(b'}');
        members.truncate(start);
    } else if is(value, &raw mut ffi::PyList_Type) {
        if depth >= JCS_MAX_DEPTH {
            return None;
        }
        out.push(b'[');
        for at in 0..ffi::PyList_Size(value) {
            if at > 0 {
                out.push(b',');
            }
            write(ffi::PyList_GetItem(value, at), out, members, depth + 1)?;
        }
        out.push(b']');
    } else {
        return None;
    }
    Some(())
}

/// Two keys in RFC 8785's order: by UTF-16 code units. Code point order is the same unless the first
/// characters that differ are one from U+E000-U+FFFF and one from U+10000 up (a surrogate pair's units,
/// U+D800-U+DFFF, sort below U+E000); comparing the units decides every case.
fn utf16_order(a: &str, b: &str) -> std::cmp::Ordering {
    if a.is_ascii() && b.is_ascii() {
        return a.as_bytes().cmp(b.as_bytes());
    }
    a.encode_utf16().cmp(b.encode_utf16())
}

/// `number` in decimal, as `i64::to_string` writes it, without allocating.
fn integer(number: i64, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = number.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if number < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The bits `test` gives for the words of `bytes`, or-ed: 8 bytes at a time as one word, the last word
/// overlapping the one before, and a string of fewer than 8 bytes read as one word, overlapping or padded
/// with `a` (so `test` must find nothing in `a`, and may see a byte twice). An event's strings and keys are
/// short: a byte at a time (even vectorised, with its scalar tail) or a copy into a padded word (a call to
/// `memcpy`, then a load the store cannot forward) took about half of `string`'s time.
#[inline(always)]
fn each_word(bytes: &[u8], test: impl Fn(u64) -> u64) -> u64 {
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let half = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as u64;
    let length = bytes.len();
    match length {
        0 => 0,
        1..=3 => {
            let (first, middle, last) = (bytes[0], bytes[length / 2], bytes[length - 1]);
            test(u64::from_le_bytes([
                first, middle, last, b'a', b'a', b'a', b'a', b'a',
            ]))
        }
        4..=7 => test(half(0) | half(length - 4) << 32),
        _ => {
            let mut found = test(word(length - 8));
            for at in (0..length - 8).step_by(8) {
                found |= test(word(at));
            }
            found
        }
    }
}

/// Whether `bytes` need no escape: none is a control character, `"` or `\\`. Each test is exact for "some
/// byte of the word": `(w - 0x01..01 * n) & !w & 0x80..80` is non-zero if and only if some byte of `w` is
/// below `n` (n <= 0x80), and `w ^ 0x01..01 * c` has a zero byte where `w` has a `c`.
fn plain(bytes: &[u8]) -> bool {
    let below = |word: u64, n: u64| word.wrapping_sub(ONES * n) & !word;
    each_word(bytes, |word| {
        let quote = word ^ (ONES * b'"' as u64);
        let backslash = word ^ (ONES * b'\\' as u64);
        (below(word, 0x20) | below(quote, 1) | below(backslash, 1)) & HIGHS
    }) == 0
}

/// Whether `bytes` (UTF-8) hold a character from U+E000 up: a lead byte from 0xEE. ASCII, as keys mostly
/// are, is told by its words; anything else byte by byte.
fn high(bytes: &[u8]) -> bool {
    each_word(bytes, |word| word & HIGHS) != 0 && bytes.iter().any(|&byte| byte >= 0xee)
}

/// The first 8 bytes of `bytes`, zero-padded, as one big-endian number.
fn prefix(bytes: &[u8]) -> u64 {
    if let Some(first) = bytes.first_chunk::<8>() {
        return u64::from_be_bytes(*first);
    }
    let mut prefix = 0;
    for (at, &byte) in bytes.iter().enumerate() {
        prefix |= (byte as u64) << (56 - 8 * at);
    }
    prefix
}

/// `text` as a JSON string, escaped as ECMAScript's `JSON.stringify` escapes it.
fn string(text: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = text.as_bytes();
    // Most strings need no escape: one scan, then one copy.
    if plain(bytes) {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (at, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..at]);
        if escape.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(byte >> 4) as usize]);
            out.push(HEX[(byte & 0xf) as usize]);
        } else {
            out.extend_from_slice(escape);
        }
        start = at + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// The RFC 8785 bytes of `value`, or None where it does not vouch for them (see the module doc).
#[pyfunction]
pub fn jcs<'py>(py: Python<'py>, value: &Bound<'py, PyAny>) -> Option<Bound<'py, PyBytes>> {
    let mut out = Vec::with_capacity(1024);
    let mut members = Vec::with_capacity(64);
    // SAFETY: `value` is held by its `Bound` and the GIL by `py` for the whole walk (see `Borrowed`).
    unsafe { write(value.as_ptr(), &mut out, &mut members, 0)? };
    Some(PyBytes::new(py, &out))
}

/// An event sealed in one pass (`preflight.events.sealed`'s fast path). `fields` is the event's members, a
/// dict holding a `hash` member whose value is ignored; `prev` is the hash of the event before it. Answers
/// the chain hash -- SHA-256, in lower-case hex, of `prev`, a newline and the RFC 8785 bytes of the members
/// but `hash` -- and the RFC 8785 bytes of the members with that hash: what `jcs`, `hashlib` and a splice
/// give in Python. None where `jcs` would not vouch for the members, where there is no `hash` member, or
/// where no member sorts after it; the caller then seals the event in Python.
#[pyfunction]
pub fn jcs_sealed<'py>(
    py: Python<'py>,
    fields: &Bound<'py, PyAny>,
    prev: &str,
) -> Option<(Bound<'py, PyString>, Bound<'py, PyBytes>)> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = Vec::with_capacity(1024);
    // Where the hash member goes: before the first member sorting after it, behind that member's comma.
    let mut at: Option<usize> = None;
    // SAFETY: `fields` is held by its `Bound` and the GIL by `py` for the whole walk (see `Borrowed`).
    unsafe {
        let dict = fields.as_ptr();
        if !is(dict, &raw mut ffi::PyDict_Type) {
            return None;
        }
        let mut members = Vec::with_capacity(64);
        sorted_members(dict, &mut members)?;
        let count = members.len();
        if !members.iter().any(|member| member.key == "hash") {
            return None;
        }
        out.push(b'{');
        let mut written = 0;
        for index in 0..count {
            let member = members[index];
            if member.key == "hash" {
                continue;
            }
            if written > 0 {
                out.push(b',');
            }
            // "hash" is ASCII: byte order is UTF-16 order against it.
            if at.is_none() && member.key.as_bytes() > b"hash".as_slice() {
                at = Some(out.len());
            }
            string(member.key, &mut out);
            out.push(b':');
            write(member.value, &mut out, &mut members, 1)?;
            written += 1;
        }
        out.push(b'}');
    }
    let at = at?;
    let mut hasher = Sha256::new();
    hasher.update(prev.as_bytes());
    hasher.update(b"\n");
    hasher.update(&out);
    let mut hex = [0u8; 64];
    for (index, byte) in hasher.finalize().iter().enumerate() {
        hex[2 * index] = HEX[(byte >> 4) as usize];
        hex[2 * index + 1] = HEX[(byte & 0xf) as usize];
    }
    const OPEN: &[u8] = b"\"hash\":\"";
    const CLOSE: &[u8] = b"\",";
    // The published bytes written once, into the answer itself.
    let sealed = PyBytes::new_with(
        py,
        out.len() + OPEN.len() + hex.len() + CLOSE.len(),
        |sealed| {
            let mut from = 0;
            for part in [&out[..at], OPEN, &hex, CLOSE, &out[at..]] {
                sealed[from..from + part.len()].copy_from_slice(part);
                from += part.len();
            }
            Ok(())
        },
    )
    .ok()?;
    // SAFETY: `hex` holds only ASCII hex digits.
    let hex = unsafe { std::str::from_utf8_unchecked(&hex) };
    Some((PyString::new(py, hex), sealed))
}

/// A digest in one pass (`preflight.events.digest`'s fast path): `sha256:` and the SHA-256, in lower-case hex,
/// of `value`'s RFC 8785 bytes -- which are `preflight.chain.canonical_json`'s bytes where they hold no
/// character from U+E000 up (`canonical_json` asks `jcs` on that rule). None where `jcs` would not vouch for
/// `value` or its bytes hold such a character; the caller then digests it in Python. One call where the
/// digest took five (the writer, the check of its bytes, `hashlib`'s SHA-256 -- OpenSSL's, whose object is
/// set up for every digest -- its hex and the prefix), for the two digests of the engine bench's run.
#[pyfunction]
pub fn jcs_digest<'py>(py: Python<'py>, value: &Bound<'py, PyAny>) -> Option<Bound<'py, PyString>> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    const PREFIX: &[u8] = b"sha256:";
    let mut out = Vec::with_capacity(1024);
    let mut members = Vec::with_capacity(64);
    // SAFETY: `value` is held by its `Bound` and the GIL by `py` for the whole walk (see `Borrowed`).
    unsafe { write(value.as_ptr(), &mut out, &mut members, 0)? };
    if high(&out) {
        return None;
    }
    let mut text = [0u8; 7 + 64];
    text[..PREFIX.len()].copy_from_slice(PREFIX);
    for (index, byte) in Sha256::digest(&out).iter().enumerate() {
        text[PREFIX.len() + 2 * index] = HEX[(byte >> 4) as usize];
        text[PREFIX.len() + 2 * index + 1] = HEX[(byte & 0xf) as usize];
    }
    // SAFETY: `text` holds only ASCII.
    let text = unsafe { std::str::from_utf8_unchecked(&text) };
    Some(PyString::new(py, text))
}

/// Whether `value` is plain JSON as `preflight.chain.plain_json` says it (its compiled walk): made only of dicts
/// with `str` keys, lists, `str`, `bool`, `None` and `int` within +-(2**63 - 1), each of its exact built-in
/// type -- the values `jcs` vouches for, bar a lone surrogate (a `str` all the same) and `i64::MIN`. With
/// `max_depth`, also nested no deeper than it (the top level is depth 0; any value below it is refused).
/// Without, None where the value nests deeper than `JCS_MAX_DEPTH`: the caller walks it (a value holding
/// itself is then the caller's, as before). The walk keeps its own stack: no recursion.
#[pyfunction]
#[pyo3(signature = (value, max_depth=None))]
pub fn plain_json(value: &Bound<'_, PyAny>, max_depth: Option<usize>) -> Option<bool> {
    let limit = max_depth.unwrap_or(JCS_MAX_DEPTH);
    let mut stack: Vec<(Borrowed, usize)> = Vec::with_capacity(32);
    stack.push((value.as_ptr(), 0));
    // SAFETY: `value` is held by its `Bound`, and so the GIL, for the whole walk (see `Borrowed`).
    unsafe {
        while let Some((value, depth)) = stack.pop() {
            if depth > limit {
                return if max_depth.is_some() {
                    Some(false)
                } else {
                    None
                };
            }
            if is(value, &raw mut ffi::PyUnicode_Type)
                || value == ffi::Py_None()
                || is(value, &raw mut ffi::PyBool_Type)
            {
                continue;
            }
            if is(value, &raw mut ffi::PyDict_Type) {
                let mut at: ffi::Py_ssize_t = 0;
                let mut key: Borrowed = std::ptr::null_mut();
                let mut item: Borrowed = std::ptr::null_mut();
                while ffi::PyDict_Next(value, &mut at, &mut key, &mut item) != 0 {
                    if !is(key, &raw mut ffi::PyUnicode_Type) {
                        return Some(false);
                    }
                    stack.push((item, depth + 1));
                }
            } else if is(value, &raw mut ffi::PyList_Type) {
                for at in 0..ffi::PyList_Size(value) {
                    stack.push((ffi::PyList_GetItem(value, at), depth + 1));
                }
            } else if is(value, &raw mut ffi::PyLong_Type) {
                match int64(value) {
                    Some(number) if number != i64::MIN => {}
                    _ => return Some(false),
                }
            } else {
                return Some(false);
            }
        }
    }
    Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(text: &str) -> String {
        let mut out = Vec::new();
        string(text, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn strings_are_escaped_as_ecmascript_does() {
        assert_eq!(escaped("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(
            escaped("\u{8}\u{c}\n\r\t\u{1}\u{1f}"),
            r#""\b\f\n\r\t\u0001\u001f""#
        );
        assert_eq!(escaped("\u{7f}\u{2028}é😀"), "\"\u{7f}\u{2028}é😀\"");
    }

    #[test]
    fn the_word_scan_finds_every_byte_to_escape() {
        // Every byte value, alone or among plain and non-ASCII bytes, at every position of strings of 0 to 17
        // bytes (both sides of a word's edge and the padded last word).
        let escaped = |byte: u8| byte < 0x20 || byte == b'"' || byte == b'\\';
        for byte in 0..=255u8 {
            for length in 1..=17 {
                for at in 0..length {
                    for filler in [b'a', 0x7f, 0xee, b'!', b'#', b'[', b']', 0x20] {
                        let mut bytes = vec![filler; length];
                        bytes[at] = byte;
                        assert_eq!(plain(&bytes), !escaped(byte), "{bytes:?}");
                    }
                }
            }
        }
        assert!(plain(b""));
    }

    #[test]
    fn keys_are_told_high_and_prefixed_exactly() {
        for text in [
            "",
            "a",
            "\u{d7ff}",
            "\u{e000}",
            "abcdefg\u{ffff}",
            "\u{10000}",
            "\u{7ff}xyz",
            "abcdefghi",
        ] {
            let bytes = text.as_bytes();
            assert_eq!(
                high(bytes),
                bytes.iter().any(|&byte| byte >= 0xee),
                "{text:?}"
            );
            let mut first = [0u8; 8];
            let length = bytes.len().min(8);
            first[..length].copy_from_slice(&bytes[..length]);
            assert_eq!(prefix(bytes), u64::from_be_bytes(first), "{text:?}");
        }
    }

    #[test]
    fn integers_are_written_as_to_string_writes_them() {
        for number in [
            0,
            7,
            -7,
            10,
            -10,
            1234567890,
            i64::MAX,
            i64::MIN,
            i64::MIN + 1,
        ] {
            let mut out = Vec::new();
            integer(number, &mut out);
            assert_eq!(out, number.to_string().into_bytes());
        }
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        use std::cmp::Ordering::*;
        assert_eq!(utf16_order("a", "b"), Less);
        assert_eq!(utf16_order("ab", "a"), Greater);
        // U+FFFD sorts after U+1F600's high surrogate (U+D83D), though its code point is lower.
        assert_eq!(utf16_order("\u{fffd}", "\u{1f600}"), Greater);
        assert_eq!(utf16_order("\u{d7ff}", "\u{1f600}"), Less);
    }
}
