//! Reading a file an operator names (the config file, the web config and its certificates, the
//! pods file, secrets, CA files): only a regular file, only up to a bound. A FIFO, a device or a proc file
//! named by mistake is one clear error, not a start that hangs or reads without end.

use std::{
    io::Read as _,
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::Path,
};

use rustls::pki_types::{CertificateDer, pem::PemObject as _};

/// A configuration file's bound: far above any real one.
pub const CONFIG_MAX_BYTES: u64 = 1 << 20;

/// The file's bytes, if it is a regular file of at most `max_bytes`.
pub fn read(path: &Path, max_bytes: u64) -> Result<Vec<u8>, String> {
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    // Checked before the open too: opening some devices does something (a watchdog starts).
    regular(path, &std::fs::metadata(path).map_err(cannot)?)?;
    // Non-blocking, so that a FIFO put there since the check does not wait for a writer; a
    // regular file's reads ignore the flag.
    let file =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    regular(path, &meta)?;
    let too_large = || format!("{} is larger than {}: not read", path.display(), size(max_bytes));
    if meta.len() > max_bytes {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // Bounded even if the file grows between the stat and the read (and for proc files, whose
    // size says 0).
    file.take(max_bytes + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Whether `meta` (of `path`) is a regular file; if not, the one line saying what it is.
pub fn regular(path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(());
    }
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a device"
    };
    Err(format!("{} is {what}, not a regular file", path.display()))
}

/// The file's text, as [`read`], if it is UTF-8.
pub fn read_text(path: &Path, max_bytes: u64) -> Result<String, String> {
    String::from_utf8(read(path, max_bytes)?).map_err(|_| format!("{} is not UTF-8 text", path.display()))
}

/// The certificates of a PEM file (read as [`read`]), or why not, starting with the path.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(path, CONFIG_MAX_BYTES)?;
    CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_within_the_bound_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "listen = \"0.0.0.0:9700\"\n").unwrap();
        assert_eq!(read_text(&path, 1024).unwrap(), "listen = \"0.0.0.0:9700\"\n");
        assert_eq!(read_text(&path, 24).unwrap().len(), 24);
    }

    #[test]
    fn what_is_not_a_small_regular_file_is_one_error() {
        let dir = tempfile::tempdir().unwrap();
        let large = dir.path().join("large");
        std::fs::write(&large, vec![b'x'; 2048]).unwrap();
        assert_eq!(
            read(&large, 1024).unwrap_err(),
            format!("{} is larger than 1 KiB: not read", large.display())
        );

        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // With no writer: an error at once, not a read that waits for one.
        assert_eq!(
            read(&fifo, 1024).unwrap_err(),
            format!("{} is a FIFO, not a regular file", fifo.display())
        );

        assert_eq!(
            read(Path::new("/dev/zero"), 1024).unwrap_err(),
            "/dev/zero is a device, not a regular file"
        );
        assert_eq!(
            read(dir.path(), 1024).unwrap_err(),
            format!("{} is a directory, not a regular file", dir.path().display())
        );
        // A proc file is regular but says its size is 0: the bound holds.
        assert!(
            read(Path::new("/proc/self/maps"), 16)
                .unwrap_err()
                .ends_with("is larger than 16 bytes: not read")
        );
        assert!(read(&dir.path().join("missing"), 1024).unwrap_err().starts_with("cannot read "));

        let binary = dir.path().join("binary");
        std::fs::write(&binary, [0xff, 0xfe]).unwrap();
        assert_eq!(read_text(&binary, 1024).unwrap_err(), format!("{} is not UTF-8 text", binary.display()));
    }
}
