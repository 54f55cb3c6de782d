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

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyList, PyString};
use sha2::{Digest, Sha256};

/// The deepest nesting written (a top-level object or array is level 1); deeper, the caller writes it.
pub const JCS_MAX_DEPTH: usize = 128;

/// Appends the JCS bytes of `value` to `out`; `None` where it does not vouch for them.
fn write(value: &Bound<'_, PyAny>, out: &mut Vec<u8>, depth: usize) -> Option<()> {
    if value.is_none() {
        out.extend_from_slice(b"null");
    } else if value.is_exact_instance_of::<PyString>() {
        let text = value.cast::<PyString>().ok()?.to_str().ok()?; // a lone surrogate: not vouched for
        string(text, out);
    } else if value.is_exact_instance_of::<PyBool>() {
        out.extend_from_slice(if value.is_truthy().ok()? {
            b"true"
        } else {
            b"false"
        });
    } else if value.is_exact_instance_of::<PyInt>() {
        let number: i64 = value.extract().ok()?;
        integer(number, out);
    } else if value.is_exact_instance_of::<PyDict>() {
        if depth >= JCS_MAX_DEPTH {
            return None;
        }
        let dict = value.cast::<PyDict>().ok()?;
        let mut members: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)> = Vec::with_capacity(dict.len());
        for (key, item) in dict.iter() {
            if !key.is_exact_instance_of::<PyString>() {
                return None;
            }
            members.push((key, item));
        }
        let keys = sorted_keys(&members)?;
        out.push(b'{');
        for (position, (key, index)) in keys.iter().enumerate() {
            if position > 0 {
                out.push(b',');
            }
            string(key, out);
            out.push(b':');
            write(&members[*index].1, out, depth + 1)?;
        }
        out.push(b'}');
    } else if value.is_exact_instance_of::<PyList>() {
        if depth >= JCS_MAX_DEPTH {
            return None;
        }
        let list = value.cast::<PyList>().ok()?;
        out.push(b'[');
        for (position, item) in list.iter().enumerate() {
            if position > 0 {
                out.push(b',');
            }
            write(&item, out, depth + 1)?;
        }
        out.push(b']');
    } else {
        return None;
    }
    Some(())
}

/// The keys of `members` (each a `str`) in RFC 8785's order, with each one's index in `members`; None where a
/// key is a lone surrogate. Keys are compared by their UTF-8 bytes -- code point order, the same as UTF-16's --
/// unless both hold a character from U+E000 up (a lead byte from 0xEE: where the two orders can differ), which
/// `utf16_order` compares: each key is scanned once, not at every comparison.
fn sorted_keys<'a>(
    members: &'a [(Bound<'_, PyAny>, Bound<'_, PyAny>)],
) -> Option<Vec<(&'a str, usize)>> {
    let mut keys: Vec<(&str, bool, usize)> = Vec::with_capacity(members.len());
    for (index, (key, _)) in members.iter().enumerate() {
        let text = key.cast::<PyString>().ok()?.to_str().ok()?;
        let high = text
            .as_bytes()
            .iter()
            .fold(false, |seen, &byte| seen | (byte >= 0xee));
        keys.push((text, high, index));
    }
    keys.sort_unstable_by(|(a, a_high, _), (b, b_high, _)| {
        if *a_high && *b_high {
            utf16_order(a, b)
        } else {
            a.as_bytes().cmp(b.as_bytes())
        }
    });
    Some(
        keys.into_iter()
            .map(|(key, _, index)| (key, index))
            .collect(),
    )
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

/// `text` as a JSON string, escaped as ECMAScript's `JSON.stringify` escapes it.
fn string(text: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = text.as_bytes();
    // Most strings need no escape: one scan without an early exit (the compiler vectorises it), then one copy.
    let plain = bytes.iter().fold(true, |plain, &byte| {
        plain & (byte >= 0x20 && byte != b'"' && byte != b'\\')
    });
    if plain {
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
    write(value, &mut out, 0)?;
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
) -> Option<(String, Bound<'py, PyBytes>)> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    if !fields.is_exact_instance_of::<PyDict>() {
        return None;
    }
    let dict = fields.cast::<PyDict>().ok()?;
    let mut members: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)> = Vec::with_capacity(dict.len());
    for (key, item) in dict.iter() {
        if !key.is_exact_instance_of::<PyString>() {
            return None;
        }
        members.push((key, item));
    }
    let keys = sorted_keys(&members)?;
    if !keys.iter().any(|(key, _)| *key == "hash") {
        return None;
    }
    let mut out = Vec::with_capacity(1024);
    out.push(b'{');
    // Where the hash member goes: before the first member sorting after it, behind that member's comma.
    let mut at: Option<usize> = None;
    let mut written = 0;
    for (key, index) in keys.iter() {
        if *key == "hash" {
            continue;
        }
        if written > 0 {
            out.push(b',');
        }
        if at.is_none() && utf16_order(key, "hash") == std::cmp::Ordering::Greater {
            at = Some(out.len());
        }
        string(key, &mut out);
        out.push(b':');
        write(&members[*index].1, &mut out, 1)?;
        written += 1;
    }
    out.push(b'}');
    let at = at?;
    let mut hasher = Sha256::new();
    hasher.update(prev.as_bytes());
    hasher.update(b"\n");
    hasher.update(&out);
    let mut hex = Vec::with_capacity(64);
    for byte in hasher.finalize().iter() {
        hex.push(HEX[(byte >> 4) as usize]);
        hex.push(HEX[(byte & 0xf) as usize]);
    }
    let mut sealed = Vec::with_capacity(out.len() + 76);
    sealed.extend_from_slice(&out[..at]);
    sealed.extend_from_slice(b"\"hash\":\"");
    sealed.extend_from_slice(&hex);
    sealed.extend_from_slice(b"\",");
    sealed.extend_from_slice(&out[at..]);
    let hex = String::from_utf8(hex).ok()?;
    Some((hex, PyBytes::new(py, &sealed)))
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
    let mut stack: Vec<(Bound<'_, PyAny>, usize)> = vec![(value.clone(), 0)];
    while let Some((value, depth)) = stack.pop() {
        if depth > limit {
            return if max_depth.is_some() {
                Some(false)
            } else {
                None
            };
        }
        if value.is_none()
            || value.is_exact_instance_of::<PyString>()
            || value.is_exact_instance_of::<PyBool>()
        {
            continue;
        }
        if value.is_exact_instance_of::<PyDict>() {
            for (key, item) in value.cast::<PyDict>().ok()?.iter() {
                if !key.is_exact_instance_of::<PyString>() {
                    return Some(false);
                }
                stack.push((item, depth + 1));
            }
        } else if value.is_exact_instance_of::<PyList>() {
            for item in value.cast::<PyList>().ok()?.iter() {
                stack.push((item, depth + 1));
            }
        } else if value.is_exact_instance_of::<PyInt>() {
            match value.extract::<i64>() {
                Ok(number) if number != i64::MIN => {}
                _ => return Some(false),
            }
        } else {
            return Some(false);
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
