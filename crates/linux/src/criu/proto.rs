//! Protocol buffers, field by field, for the two places the engine reads or writes CRIU's: its
//! images (`images`) and its RPC (`rpc`). A message is a list of fields; one that is not read is
//! kept (or skipped) as it came, by its wire type.

use std::io;

fn malformed(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("CRIU protobuf: {what}"))
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    Varint(u64),
    Bytes(Vec<u8>),
    Fixed64([u8; 8]),
    Fixed32([u8; 4]),
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Field {
    pub number: u64,
    pub value: Value,
}

fn varint(b: &[u8], i: &mut usize) -> io::Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i).ok_or_else(|| malformed("truncated varint"))?;
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(v);
        }
    }
    Err(malformed("varint too long"))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The fields of one message, in order.
pub(super) fn decode(b: &[u8]) -> io::Result<Vec<Field>> {
    let mut i = 0;
    let mut fields = Vec::new();
    let take = |i: &mut usize, n: usize| -> io::Result<Vec<u8>> {
        let s = i
            .checked_add(n)
            .and_then(|end| b.get(*i..end))
            .ok_or_else(|| malformed("truncated field"))?;
        *i += n;
        Ok(s.to_vec())
    };
    while i < b.len() {
        let key = varint(b, &mut i)?;
        let value = match key & 7 {
            0 => Value::Varint(varint(b, &mut i)?),
            1 => {
                let s = take(&mut i, 8)?;
                Value::Fixed64([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
            }
            2 => {
                let n = varint(b, &mut i)? as usize;
                Value::Bytes(take(&mut i, n)?)
            }
            5 => {
                let s = take(&mut i, 4)?;
                Value::Fixed32([s[0], s[1], s[2], s[3]])
            }
            _ => return Err(malformed("unknown wire type")),
        };
        fields.push(Field {
            number: key >> 3,
            value,
        });
    }
    Ok(fields)
}

/// One message of `fields`, in order.
pub(super) fn encode(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fields {
        let wire = match f.value {
            Value::Varint(_) => 0,
            Value::Fixed64(_) => 1,
            Value::Bytes(_) => 2,
            Value::Fixed32(_) => 5,
        };
        put_varint(&mut out, f.number << 3 | wire);
        match &f.value {
            Value::Varint(v) => put_varint(&mut out, *v),
            Value::Fixed64(b) => out.extend_from_slice(b),
            Value::Fixed32(b) => out.extend_from_slice(b),
            Value::Bytes(b) => {
                put_varint(&mut out, b.len() as u64);
                out.extend_from_slice(b);
            }
        }
    }
    out
}

impl Field {
    pub(super) fn varint(number: u64, v: u64) -> Field {
        Field {
            number,
            value: Value::Varint(v),
        }
    }

    pub(super) fn bytes(number: u64, b: &[u8]) -> Field {
        Field {
            number,
            value: Value::Bytes(b.to_vec()),
        }
    }
}
