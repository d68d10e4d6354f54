//! A reader that hashes what passes through it (so a blob or a layer's uncompressed stream is
//! checked against its digest as it is read) and stops once its budget is spent (so what the tar
//! crate reads into memory between entries stays bounded, whatever a hostile archive declares).

use std::cell::Cell;
use std::io::{self, Read, Seek, SeekFrom};
use std::rc::Rc;

use ring::digest;

use sandbox_mcp_model::ids::hex;

/// Most tar metadata read in one place: the long names and PAX records before an entry (the tar
/// crate holds them in memory), or the padding after a layer's end-of-archive marker.
pub(crate) const MAX_META: u64 = 1 << 20;

/// Passes reads through, hashing them, and fails once `budget` bytes have passed
/// since its owner last refilled it. The owner refills it with each entry's size plus
/// [`MAX_META`], so what the tar crate reads into memory between entries (long names, PAX
/// records) is bounded, whatever sizes a hostile archive declares.
pub(crate) struct Meter<R> {
    inner: R,
    sha: digest::Context,
    pub(crate) budget: Rc<Cell<u64>>,
}

impl<R> Meter<R> {
    /// A hashing meter with `budget` bytes to start with.
    pub(crate) fn new(inner: R, budget: u64) -> Self {
        Meter {
            inner,
            sha: digest::Context::new(&digest::SHA256),
            budget: Rc::new(Cell::new(budget)),
        }
    }

    /// `sha256:<hex>` of everything read so far.
    pub(crate) fn digest(&self) -> String {
        format!("sha256:{}", hex(self.sha.clone().finish().as_ref()))
    }
}

impl<R: Read> Read for Meter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.budget.get();
        if left == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "more than 1 MiB of tar metadata, or of data after the end of the archive",
            ));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.budget.set(left - n as u64);
        self.sha.update(&buf[..n]);
        Ok(n)
    }
}

impl<R: Seek> Seek for Meter<R> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.inner.seek(pos)
    }
}
