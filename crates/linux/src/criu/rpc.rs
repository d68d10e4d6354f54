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
//! bench's "parent stopped" was 0.85–0.92 of what it had been in two same-run A/B runs
//! (docs/benchmarks-ab-live.md is the later).
//!
//! The messages go through `proto` (shared with the images): the request sets a dozen fields, and
//! a response is read for three, the rest skipped by wire type.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::Moments;
use super::proto::{Field, Value, decode, encode};

/// What differs between dumps; the rest of `criu_opts` is the same for every one (below).
pub(super) struct DumpOptions<'a> {
    pub pid: i32,
    pub images_dir: &'a str,
    pub external: &'a [String],
    pub unprivileged: bool,
}

/// `criu_req_type`.
const DUMP: u64 = 1;
const NOTIFY: u64 = 6;

/// The dump's request.
pub(super) fn dump_request(o: &DumpOptions<'_>) -> Vec<u8> {
    let flag = |number, on: bool| Field::varint(number, u64::from(on));
    let mut opts = vec![
        // images_dir_fd is required; -1 says the directory is named by images_dir.
        Field::varint(1, -1i64 as u64),
        Field::varint(2, o.pid as i64 as u64),
        // leave_running, overridden by leave_stopped (69) where CRIU knows it: a CRIU that did
        // not would leave the tree running rather than kill it (its default after a dump).
        flag(3, true),
        // tcp_established: dumped (the network locked meanwhile) so the tree can be; the
        // restore closes them, a peer outside cannot be cloned.
        flag(5, true),
        Field::varint(9, 2),
        Field::bytes(10, b"criu.log"),
        // notify_scripts: the stops `converse` answers.
        flag(12, true),
        // manage_cgroups_mode IGNORE.
        Field::varint(34, 0),
    ];
    opts.extend(o.external.iter().map(|e| Field::bytes(37, e.as_bytes())));
    opts.extend([
        flag(67, o.unprivileged),
        Field::bytes(68, o.images_dir.as_bytes()),
        flag(69, true),
    ]);
    encode(&[Field::varint(1, DUMP), Field::bytes(2, &encode(&opts))])
}

/// The answer to a notification: done, go on.
fn notify_done() -> Vec<u8> {
    encode(&[Field::varint(1, NOTIFY), Field::varint(3, 1)])
}

/// What CRIU sent.
#[derive(Debug, PartialEq, Eq)]
enum Response {
    /// It stopped at this action and waits for [`notify_done`].
    Notify(String),
    /// The dump's end: whether it succeeded (its errors are in its log).
    Done { success: bool },
}

/// Reads one `criu_resp`.
fn parse_response(packet: &[u8]) -> io::Result<Response> {
    let (mut kind, mut success, mut notify) = (None, false, None);
    for field in decode(packet)? {
        match (field.number, field.value) {
            (1, Value::Varint(v)) => kind = Some(v),
            (2, Value::Varint(v)) => success = v != 0,
            (5, Value::Bytes(b)) => {
                for inner in decode(&b)? {
                    if let (1, Value::Bytes(name)) = (inner.number, inner.value) {
                        notify = Some(String::from_utf8_lossy(&name).into_owned());
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

/// Sends `request` and answers CRIU's notifications until its response: whether the dump
/// succeeded, `None` if CRIU ended without one. The moments are two of its notifications:
/// `query-ext-files` comes once the tree is seized and frozen, before the first process is
/// dumped; `post-dump`, once every one is, its parasite gone.
///
/// A dump that succeeded without `query-ext-files` is refused: nothing said when the rest of
/// the sandbox had to stop. (It came to CRIU's RPC with `images_dir` and `leave_stopped`, which
/// the request needs anyway: a CRIU without them fails the dump, or leaves the tree running.)
pub(super) fn converse(
    sock: &OwnedFd,
    request: &[u8],
    at: Moments<'_>,
) -> io::Result<Option<bool>> {
    send_packet(sock, request)?;
    let mut buf = vec![0u8; 64 << 10];
    let mut frozen = false;
    loop {
        let n = recv_packet(sock, &mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        match parse_response(&buf[..n])? {
            Response::Notify(action) => {
                match action.as_str() {
                    "query-ext-files" => {
                        (at.frozen)();
                        frozen = true;
                    }
                    "post-dump" => (at.cured)(),
                    _ => {}
                }
                send_packet(sock, &notify_done())?;
            }
            Response::Done { success: true } if !frozen => {
                return Err(io::Error::other(
                    "criu never said when the tree was frozen (CRIU 4.0 or later is needed)",
                ));
            }
            Response::Done { success } => return Ok(Some(success)),
        }
    }
}

pub(super) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills the two descriptors, which we then own.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn send_packet(sock: &OwnedFd, packet: &[u8]) -> io::Result<()> {
    // SAFETY: send from a live buffer on a descriptor we hold.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            packet.as_ptr().cast(),
            packet.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One packet into `buf`; its length, 0 at the end. A packet larger than `buf` is an error.
fn recv_packet(sock: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: recv into a live buffer of its length, on a descriptor we hold.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_TRUNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let n = n as usize;
        if n > buf.len() {
            return Err(io::Error::other("criu sent an RPC packet over 64 KiB"));
        }
        return Ok(n);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::cell::RefCell;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// Plays CRIU at the other end of a socket: takes the request, sends each notification of
    /// `script` and waits for its answer (checking, at `query-ext-files`, that `frozen` was set
    /// before the answer came), then sends the dump's response (`None`: hangs up instead).
    /// Gives back the request it got.
    fn criu_says(
        script: &'static [&'static str],
        done: Option<bool>,
        frozen: Arc<AtomicBool>,
    ) -> (OwnedFd, std::thread::JoinHandle<Vec<u8>>) {
        let (ours, theirs) = seqpacket_pair().unwrap();
        let criu = std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            let n = recv_packet(&theirs, &mut buf).unwrap();
            let request = buf[..n].to_vec();
            for action in script {
                let notify = encode(&[Field::bytes(1, action.as_bytes())]);
                let packet = encode(&[
                    Field::varint(1, NOTIFY),
                    Field::varint(2, 1),
                    Field::bytes(5, &notify),
                ]);
                send_packet(&theirs, &packet).unwrap();
                let n = recv_packet(&theirs, &mut buf).unwrap();
                assert_eq!(buf[..n], notify_done(), "the answer to {action}");
                if *action == "query-ext-files" {
                    assert!(frozen.load(Ordering::SeqCst), "answered before the stop");
                }
            }
            if let Some(success) = done {
                let packet = encode(&[Field::varint(1, DUMP), Field::varint(2, success.into())]);
                send_packet(&theirs, &packet).unwrap();
            }
            request
        });
        (ours, criu)
    }

    /// `converse` with moments that log themselves (and set `frozen`).
    fn converse_logged(
        sock: &OwnedFd,
        frozen: &AtomicBool,
    ) -> (io::Result<Option<bool>>, Vec<&'static str>) {
        let log = RefCell::new(Vec::new());
        let answer = converse(
            sock,
            b"the request",
            Moments {
                frozen: &mut || {
                    frozen.store(true, Ordering::SeqCst);
                    log.borrow_mut().push("frozen");
                },
                cured: &mut || log.borrow_mut().push("cured"),
            },
        );
        (answer, log.into_inner())
    }

    #[test]
    fn the_moments_run_at_their_notifications_before_criu_goes_on() {
        let frozen = Arc::new(AtomicBool::new(false));
        let script = &["pre-dump", "query-ext-files", "post-dump"];
        let (sock, criu) = criu_says(script, Some(true), frozen.clone());
        let (answer, log) = converse_logged(&sock, &frozen);
        assert_eq!(answer.unwrap(), Some(true));
        assert_eq!(log, ["frozen", "cured"]);
        assert_eq!(criu.join().unwrap(), b"the request");

        // A failed dump is said so; a CRIU that hangs up has no answer.
        let frozen = Arc::new(AtomicBool::new(false));
        let (sock, criu) = criu_says(&["pre-dump"], Some(false), frozen.clone());
        assert_eq!(converse_logged(&sock, &frozen).0.unwrap(), Some(false));
        criu.join().unwrap();
        let (sock, criu) = criu_says(&[], None, frozen.clone());
        assert_eq!(converse_logged(&sock, &frozen).0.unwrap(), None);
        criu.join().unwrap();
    }

    #[test]
    fn a_dump_that_never_said_the_tree_was_frozen_is_refused() {
        let frozen = Arc::new(AtomicBool::new(false));
        let (sock, criu) = criu_says(&["pre-dump", "post-dump"], Some(true), frozen.clone());
        let (answer, log) = converse_logged(&sock, &frozen);
        let e = answer.unwrap_err().to_string();
        assert!(e.contains("never said when the tree was frozen"), "{e}");
        assert_eq!(log, ["cured"]);
        criu.join().unwrap();
    }

    #[test]
    fn a_dump_request_carries_its_options_as_criu_opts_fields() {
        let external = vec!["mnt[]".to_string(), "pid[4026532327]:pidns".to_string()];
        let req = dump_request(&DumpOptions {
            pid: 2753,
            images_dir: "/d",
            external: &external,
            unprivileged: false,
        });
        let fields = decode(&req).unwrap();
        assert_eq!(fields[0], Field::varint(1, DUMP));
        let Value::Bytes(opts) = &fields[1].value else {
            panic!("no criu_opts")
        };
        let seen: Vec<String> = decode(opts)
            .unwrap()
            .into_iter()
            .map(|f| match f.value {
                Value::Varint(v) => format!("{}={v}", f.number),
                Value::Bytes(b) => format!("{}={}", f.number, String::from_utf8_lossy(&b)),
                other => format!("{}={other:?}", f.number),
            })
            .collect();
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
        // type NOTIFY, success, notify { script: "query-ext-files", pid (fixed-width, as if) },
        // and a field of 64 bits.
        let notify = encode(&[
            Field::bytes(1, b"query-ext-files"),
            Field {
                number: 2,
                value: Value::Fixed32([1, 2, 3, 4]),
            },
        ]);
        let packet = encode(&[
            Field::varint(1, NOTIFY),
            Field::varint(2, 1),
            Field::bytes(5, &notify),
            Field {
                number: 11,
                value: Value::Fixed64([0; 8]),
            },
        ]);
        assert_eq!(
            parse_response(&packet).unwrap(),
            Response::Notify("query-ext-files".into())
        );

        let done = encode(&[
            Field::varint(1, DUMP),
            Field::varint(2, 0),
            Field::varint(7, 5),
            Field::bytes(9, b"Error (criu/cr-dump.c:1): it went wrong\n"),
        ]);
        assert_eq!(
            parse_response(&done).unwrap(),
            Response::Done { success: false }
        );
    }

    #[test]
    fn malformed_responses_are_errors_not_panics() {
        let notify_without_name = encode(&[Field::varint(1, NOTIFY)]);
        let too_long = [[0x08].as_slice(), &[0xff; 10], &[1]].concat();
        let huge = [[0x0a].as_slice(), &[0xff; 9], &[1]].concat();
        for bad in [
            &[][..],
            &[0x08][..],       // a key without its value
            &[0x0a, 5, 1][..], // a string longer than the packet
            &huge[..],         // a string longer than memory
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
