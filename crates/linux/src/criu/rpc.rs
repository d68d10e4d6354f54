//! The little of CRIU's RPC a dump needs (its `rpc.proto`, spoken over `criu swrk FD`).
//!
//! One request (`criu_req`, type DUMP, with the dump's options) goes to CRIU as one packet of a
//! `SOCK_SEQPACKET` socket. With `notify_scripts` set, CRIU then stops at each point it would
//! run an action script, sends a `criu_resp` of type NOTIFY naming it, and waits for the
//! client's answer before going on; the last packet is the dump's own response. The point of
//! speaking it rather than the command line is two of those stops. `query-ext-files`: CRIU sends
//! it once it has seized and frozen the whole tree and before it puts its code into any process
//! of it, so the engine stops the sandbox's other processes there instead of before CRIU starts;
//! and `post-dump`, once its code has left every process, where the next tree to dump may run.
//! CRIU's start, its seizing of the tree and its exit no longer stop the rest of the sandbox: the
//! bench's "parent stopped" went from 102 to 88 ms (docs/benchmarks-ab-live.md).
//!
//! Protocol buffers by hand: the request uses a dozen scalar and string fields, and a response
//! is read for three of its fields, skipping the rest by wire type.

use std::io;

/// The fields of `criu_opts` a dump sets.
pub(super) struct DumpOptions<'a> {
    pub pid: i32,
    pub images_dir: &'a str,
    pub log_file: &'a str,
    pub log_level: u32,
    /// Sent with `leave_running`, which CRIU reads first: the tree stays stopped where CRIU
    /// reads both, and runs on (is not killed) where it would not know `leave_stopped`.
    pub leave_stopped: bool,
    pub tcp_established: bool,
    /// `criu_cg_mode`: `IGNORE` is 0.
    pub manage_cgroups_ignore: bool,
    pub external: &'a [String],
    pub unprivileged: bool,
}

/// `criu_req_type`.
const DUMP: u64 = 1;
const NOTIFY: u64 = 6;

/// The dump's request.
pub(super) fn dump_request(o: &DumpOptions<'_>) -> Vec<u8> {
    let mut opts = Vec::new();
    // images_dir_fd is required; -1 says the directory is named by images_dir.
    varint_field(&mut opts, 1, -1i64 as u64);
    varint_field(&mut opts, 2, o.pid as i64 as u64);
    // leave_running, overridden by leave_stopped (below) where CRIU knows it.
    bool_field(&mut opts, 3, o.leave_stopped);
    bool_field(&mut opts, 5, o.tcp_established);
    varint_field(&mut opts, 9, u64::from(o.log_level));
    bytes_field(&mut opts, 10, o.log_file.as_bytes());
    bool_field(&mut opts, 12, true);
    if o.manage_cgroups_ignore {
        varint_field(&mut opts, 34, 0);
    }
    for e in o.external {
        bytes_field(&mut opts, 37, e.as_bytes());
    }
    bool_field(&mut opts, 67, o.unprivileged);
    bytes_field(&mut opts, 68, o.images_dir.as_bytes());
    bool_field(&mut opts, 69, o.leave_stopped);
    let mut req = Vec::new();
    varint_field(&mut req, 1, DUMP);
    bytes_field(&mut req, 2, &opts);
    req
}

/// The answer to a notification: done, go on.
pub(super) fn notify_done() -> Vec<u8> {
    let mut req = Vec::new();
    varint_field(&mut req, 1, NOTIFY);
    bool_field(&mut req, 3, true);
    req
}

/// What CRIU sent.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Response {
    /// It stopped at this action and waits for [`notify_done`].
    Notify(String),
    /// The dump's end: whether it succeeded (its errors are in its log).
    Done { success: bool },
}

/// Reads one `criu_resp`.
pub(super) fn parse_response(packet: &[u8]) -> io::Result<Response> {
    let (mut kind, mut success, mut notify) = (None, false, None);
    for field in Fields(packet) {
        match field? {
            (1, Value::Varint(v)) => kind = Some(v),
            (2, Value::Varint(v)) => success = v != 0,
            (5, Value::Bytes(b)) => {
                for inner in Fields(b) {
                    if let (1, Value::Bytes(name)) = inner? {
                        notify = Some(String::from_utf8_lossy(name).into_owned());
                    }
                }
            }
            _ => {}
        }
    }
    match (kind, notify) {
        (Some(NOTIFY), Some(name)) => Ok(Response::Notify(name)),
        (Some(NOTIFY), None) => Err(malformed("a notification without its action")),
        (Some(_), _) => Ok(Response::Done { success }),
        (None, _) => Err(malformed("a response without its type")),
    }
}

fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("criu sent {what} over RPC"),
    )
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u64, v: u64) {
    varint(out, field << 3);
    varint(out, v);
}

fn bool_field(out: &mut Vec<u8>, field: u64, v: bool) {
    varint_field(out, field, u64::from(v));
}

fn bytes_field(out: &mut Vec<u8>, field: u64, b: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// A fixed-width field (wire types 1 and 5), not read.
    Fixed,
}

/// The fields of one message, in order; an error ends it.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn read_varint(&mut self) -> io::Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self
                .0
                .split_first()
                .ok_or_else(|| malformed("a truncated message"))?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(malformed("a varint longer than 10 bytes"))
    }

    fn take(&mut self, n: u64) -> io::Result<&'a [u8]> {
        let all: &'a [u8] = self.0;
        let n = usize::try_from(n).map_err(|_| malformed("a field longer than memory"))?;
        if n > all.len() {
            return Err(malformed("a truncated message"));
        }
        let (head, rest) = all.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = io::Result<(u64, Value<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = (|| {
            let key = self.read_varint()?;
            let value = match key & 7 {
                0 => Value::Varint(self.read_varint()?),
                1 => {
                    self.take(8)?;
                    Value::Fixed
                }
                2 => {
                    let n = self.read_varint()?;
                    Value::Bytes(self.take(n)?)
                }
                5 => {
                    self.take(4)?;
                    Value::Fixed
                }
                _ => return Err(malformed("a field of an unknown wire type")),
            };
            Ok((key >> 3, value))
        })();
        if field.is_err() {
            self.0 = &[];
        }
        Some(field)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_request_carries_its_options_as_criu_opts_fields() {
        let external = vec!["mnt[]".to_string(), "pid[4026532327]:pidns".to_string()];
        let req = dump_request(&DumpOptions {
            pid: 2753,
            images_dir: "/d",
            log_file: "criu.log",
            log_level: 2,
            leave_stopped: true,
            tcp_established: true,
            manage_cgroups_ignore: true,
            external: &external,
            unprivileged: false,
        });
        let fields: Vec<(u64, Value)> = Fields(&req).map(Result::unwrap).collect();
        assert!(matches!(fields[0], (1, Value::Varint(DUMP))));
        let (2, Value::Bytes(opts)) = fields[1] else {
            panic!("no criu_opts")
        };
        let mut seen = Vec::new();
        for f in Fields(opts) {
            match f.unwrap() {
                (n, Value::Varint(v)) => seen.push(format!("{n}={v}")),
                (n, Value::Bytes(b)) => seen.push(format!("{n}={}", String::from_utf8_lossy(b))),
                (n, Value::Fixed) => seen.push(format!("{n}=fixed")),
            }
        }
        assert_eq!(
            seen,
            [
                // -1 as an int32 is the ten-byte varint of its 64-bit two's complement.
                format!("1={}", u64::MAX),
                "2=2753".into(),
                "3=1".into(),
                "5=1".into(),
                "9=2".into(),
                "10=criu.log".into(),
                "12=1".into(),
                "34=0".into(),
                "37=mnt[]".into(),
                "37=pid[4026532327]:pidns".into(),
                "67=0".into(),
                "68=/d".into(),
                "69=1".into(),
            ]
        );
        assert_eq!(notify_done(), [0x08, 6, 0x18, 1]);
    }

    #[test]
    fn responses_are_read_for_their_kind_and_unknown_fields_are_skipped() {
        // type NOTIFY, success, notify { script: "query-ext-files", pid (fixed-width, as if) }.
        let mut notify = Vec::new();
        bytes_field(&mut notify, 1, b"query-ext-files");
        notify.extend_from_slice(&[0x15, 1, 2, 3, 4]);
        let mut packet = Vec::new();
        varint_field(&mut packet, 1, NOTIFY);
        bool_field(&mut packet, 2, true);
        bytes_field(&mut packet, 5, &notify);
        packet.extend_from_slice(&[0x59, 0, 0, 0, 0, 0, 0, 0, 0]); // field 11, 64-bit
        assert_eq!(
            parse_response(&packet).unwrap(),
            Response::Notify("query-ext-files".into())
        );

        let mut done = Vec::new();
        varint_field(&mut done, 1, DUMP);
        bool_field(&mut done, 2, false);
        varint_field(&mut done, 7, 5);
        bytes_field(&mut done, 9, b"Error (criu/cr-dump.c:1): it went wrong\n");
        assert_eq!(
            parse_response(&done).unwrap(),
            Response::Done { success: false }
        );
    }

    #[test]
    fn malformed_responses_are_errors_not_panics() {
        let mut notify_without_name = Vec::new();
        varint_field(&mut notify_without_name, 1, NOTIFY);
        let too_long = [[0x08].as_slice(), &[0xff; 10], &[1]].concat();
        for bad in [
            &[][..],
            &[0x08][..],       // a key without its value
            &[0x0a, 5, 1][..], // a string longer than the packet
            &[0x0b][..],       // wire type 3
            &too_long[..],     // a varint of 11 bytes
            &notify_without_name[..],
        ] {
            assert_eq!(
                parse_response(bad).unwrap_err().kind(),
                io::ErrorKind::InvalidData,
                "{bad:?}"
            );
        }
    }
}
