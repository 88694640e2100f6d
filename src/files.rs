//! Named files in and out: [`write_atomic`] is the one way rumus writes a file a script or a host
//! names (checkpoints, `write_text`), [`open_regular`] the one way it opens a file to read (a
//! FIFO, socket or device is refused: opening or reading one can block forever or never end),
//! and [`read_source`] the one way it reads a source file (scripts, model files): with a size
//! limit, UTF-8 checked with the line and column of the first bad byte, and byte-order marks
//! named (a UTF-8 one is skipped, as rustc and Python do).
//!
//! The bytes go to a new temporary file in the target's own folder, created exclusively
//! (`O_CREAT | O_EXCL`, and `O_NOFOLLOW` where there is one) under a name nobody can predict, so
//! a planted file or symbolic link can neither redirect nor pre-empt the write. The file is
//! flushed to disk and renamed over the target: a crash leaves the old file or the new one,
//! never half of one. Temporary files that an earlier, killed write to the same target left
//! behind are removed by the next write; every failure is an error.
//!
//! The one other file rumus writes is the metrics log (`rumus run --metrics`, [`create_log`]), appended line by
//! line as the run goes so that it can be followed and a killed run keeps its lines;
//! `tests/it/script_writes.rs` checks that no other code creates, overwrites or renames files.

use crate::err;
use crate::error::{Error, Result};
use crate::source::{Source, Span};
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest source file read, in bytes. Data belongs in data files (`csv`, `text`).
pub const MAX_SOURCE_FILE_BYTES: u64 = 16 << 20;

/// Open the file at `path` to read it, or an `Io` error naming it: a folder, and anything else
/// that is not a regular file (a FIFO would block the open, or the first read, until another
/// process writes to it; a device may never end), is refused. The file is opened non-blocking
/// (which a regular file ignores) so that opening a FIFO returns at once, to be refused.
pub fn open_regular(path: &Path) -> Result<fs::File> {
    let name = path.display().to_string();
    if name.is_empty() {
        return Err(err!(Io, "the file name is empty"));
    }
    let io = |e: std::io::Error| Error::io(&name, e);
    let mut opts = fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if meta.is_dir() {
        return Err(err!(Io, "{name}: is a folder, not a file"));
    }
    if !meta.is_file() {
        return Err(err!(
            Io,
            "{name}: is not a regular file (a FIFO, socket or device); rumus reads files only"
        ));
    }
    Ok(file)
}

/// Read a source file, named by its path as given ([`open_regular`]). Refuses files over 16 MiB
/// (`MAX_SOURCE_FILE_BYTES`, before reading more than that), text that is not UTF-8 (at the
/// line and column of the first bad byte), and UTF-16/32 byte-order marks; skips a UTF-8
/// byte-order mark.
pub fn read_source(path: &Path) -> Result<Arc<Source>> {
    let name = path.display().to_string();
    let io = |e: std::io::Error| Error::io(&name, e);
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_SOURCE_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > MAX_SOURCE_FILE_BYTES {
        return Err(err!(
            Io,
            "{name}: a source file may have at most {MAX_SOURCE_FILE_BYTES} bytes; this one has more"
        ));
    }
    source_from_bytes(name, bytes)
}

/// A source from raw bytes (a file's contents), checked as [`read_source`] checks them.
pub fn source_from_bytes(name: String, bytes: Vec<u8>) -> Result<Arc<Source>> {
    let bytes = match bytes.strip_prefix(b"\xEF\xBB\xBF") {
        Some(rest) => rest.to_vec(),
        None => bytes,
    };
    if let Some(encoding) = foreign_bom(&bytes) {
        let e = err!(
            Parse,
            "the file starts with a {encoding} byte-order mark; rumus reads UTF-8: save it as UTF-8"
        );
        let src = Source::new(name, String::from_utf8_lossy(&bytes).into_owned());
        return Err(e.at(Span::new(0, 0)).in_source(&src));
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Source::new(name, text)),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let byte = e.as_bytes()[at];
            let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
            let src = Source::new(name, text);
            let e = err!(
                Parse,
                "invalid UTF-8 (byte 0x{byte:02X}): source files must be UTF-8 text"
            );
            Err(e.at(Span::new(at, at + 1)).in_source(&src))
        }
    }
}

/// The encoding a file's first bytes name by a byte-order mark other than UTF-8's (UTF-16 or
/// UTF-32, either byte order), if they start with one.
pub fn foreign_bom(bytes: &[u8]) -> Option<&'static str> {
    match bytes {
        [0xFF, 0xFE, 0, 0, ..] => Some("UTF-32 little-endian"),
        [0, 0, 0xFE, 0xFF, ..] => Some("UTF-32 big-endian"),
        [0xFF, 0xFE, ..] => Some("UTF-16 little-endian"),
        [0xFE, 0xFF, ..] => Some("UTF-16 big-endian"),
        _ => None,
    }
}

/// A data file's text (all of it, a script's `read_text`, a metrics log): UTF-8, a leading
/// UTF-8 byte-order mark skipped, or a `Data` error as [`utf8_data`] gives it.
pub fn utf8_text(name: &str, bytes: Vec<u8>) -> Result<String> {
    let start = if bytes.starts_with(b"\xEF\xBB\xBF") { 3 } else { 0 };
    utf8_data(name, &bytes[start..], 1, start as u64)?;
    let mut bytes = bytes;
    bytes.drain(..start);
    // Checked just above.
    String::from_utf8(bytes).map_err(|_| err!(Data, "{name}: not valid UTF-8 text"))
}

/// `bytes` as text, where they are a part of the data file `name` that starts at line
/// `first_line` (counted from 1, at the start of a line) and at byte `offset` of the file (or
/// of its decompressed text). Text that is not UTF-8 is a `Data` error at
/// `name:line:column` of its first bad byte (the column counted in characters from 1), with
/// the byte, its offset, and what to do: the one rule by which every data reader refuses such
/// text (a CSV line, a script's `read_text`, a metrics log). A file that starts with a UTF-16 or
/// UTF-32 byte-order mark says so.
pub fn utf8_data<'a>(name: &str, bytes: &'a [u8], first_line: usize, offset: u64) -> Result<&'a str> {
    let e = match std::str::from_utf8(bytes) {
        Ok(text) => return Ok(text),
        Err(e) => e,
    };
    if offset == 0 {
        if let Some(encoding) = foreign_bom(bytes) {
            return Err(err!(
                Data,
                "{name}:1:1: the file starts with a {encoding} byte-order mark; rumus reads UTF-8 text: save the file as UTF-8"
            ));
        }
    }
    let at = e.valid_up_to();
    let valid = &bytes[..at];
    let line = first_line + valid.iter().filter(|&&b| b == b'\n').count();
    let line_start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let column = std::str::from_utf8(&valid[line_start..]).map_or(0, |s| s.chars().count()) + 1;
    Err(err!(
        Data,
        "{name}:{line}:{column}: invalid UTF-8 (byte 0x{:02X} at byte offset {}): rumus reads data files as UTF-8 text; save the file as UTF-8",
        bytes[at],
        offset + at as u64
    ))
}

/// What a target named `path` is before rumus writes to it: its folder and file name, and
/// whether something other than a regular file is already there (a device, FIFO or socket).
/// A folder is no target.
struct Target {
    folder: PathBuf,
    name: String,
    special: bool,
}

/// Most bytes of a target's name that its temporary names hold (see [`Target::stem`]).
const TEMP_STEM: usize = 200;

/// Why a path is refused as an output, as the messages say it.
const A_FOLDER: &str = "is a folder, not a file name";
const SPECIAL: &str = "is not a regular file (a device, FIFO or socket); rumus writes files only";

impl Target {
    fn of(path: &Path) -> std::result::Result<Target, &'static str> {
        let name = match path.file_name() {
            Some(n) if !path.is_dir() => n.to_string_lossy().into_owned(),
            _ => return Err(A_FOLDER),
        };
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let special = fs::metadata(path).is_ok_and(|m| !m.is_file());
        Ok(Target { folder, name, special })
    }

    /// A fresh temporary name beside the target: `.<name>.<pid>.<random>.tmp`.
    fn temporary(&self) -> PathBuf {
        let (pid, random) = (std::process::id(), unpredictable());
        self.folder.join(format!(".{}.{pid}.{random:016x}.tmp", self.stem()))
    }

    /// The name as temporary names hold it: its first [`TEMP_STEM`] bytes, so that a temporary
    /// name (33 bytes more) stays within the 255 bytes a file name may have. The whole name made
    /// the temporary name too long for a target of 223 to 255 bytes, which could not be written.
    fn stem(&self) -> &str {
        let mut end = self.name.len().min(TEMP_STEM);
        while !self.name.is_char_boundary(end) {
            end -= 1;
        }
        &self.name[..end]
    }
}

/// Write `bytes` to `path` atomically (see the module documentation). `path` must name a file
/// (not a folder) in an existing folder, and what is there already must be a regular file:
/// the rename would put a file in the place of a device, FIFO or socket (`-o /dev/stdout`
/// run as root would replace the link `/dev/stdout`, and `/dev/full` the device).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let shown = path.display();
    let target = Target::of(path).map_err(|why| err!(Io, "{shown}: {why}"))?;
    if target.special {
        return Err(err!(Io, "{shown}: {SPECIAL}"));
    }
    remove_stale_temps(&target.folder, target.stem());
    let tmp = target.temporary();
    let written = create_exclusive(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io(shown, e));
    }
    // Make the rename itself durable where the platform allows it (a folder cannot always be
    // opened or synced; the data is already on disk, so nothing is lost if this fails).
    if let Ok(dir) = fs::File::open(&target.folder) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// How a command-line output is written: a file replaced whole ([`write_atomic`]), or a log
/// appended line by line as the run goes ([`create_log`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Written whole when the work is done: a regular file only.
    File,
    /// Appended to as the run goes: a file, a pipe or a device.
    Log,
}

/// `path` resolved: links and relative spellings followed, a file not there yet by its
/// folder; `None` when neither the file nor its folder exists.
pub fn resolved(path: &Path) -> Option<PathBuf> {
    path.canonicalize().ok().or_else(|| {
        let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Some(folder.canonicalize().ok()?.join(path.file_name()?))
    })
}

/// Check, before any work, that the output `out` (given by `flag`) can be written when the work
/// needs it: not the input `input` (`what`) itself, links and relative spellings resolved
/// (`rumus run f.rms --metrics f.rms` would destroy the script); not a folder; for a file, not
/// a device, FIFO or socket (which [`write_atomic`] refuses), in an existing folder where a
/// file can be created (a probe file is created and removed). A log may be a pipe or a device
/// (`--metrics /dev/null`, `--metrics >(jq .)`). A usage error that names the flag: a long run
/// is not thrown away at its end.
pub fn check_output(flag: &str, out: &Path, what: &str, input: &Path, kind: Output) -> Result<()> {
    check_apart(flag, out, what, input)?;
    let shown = out.display();
    let refuse = |why: String| err!(Usage, "{flag} {shown}: {why}");
    let target = Target::of(out).map_err(|why| refuse(why.into()))?;
    match (target.special, kind) {
        (true, Output::Log) => return Ok(()),
        (true, Output::File) => return Err(refuse(SPECIAL.into())),
        (false, _) => {}
    }
    let probe = target.temporary();
    match create_exclusive(&probe) {
        Ok(_) => {
            let _ = fs::remove_file(&probe);
            Ok(())
        }
        // Not found: the folder, unless it is there (`/proc` refuses new files with ENOENT).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !target.folder.is_dir() => {
            Err(refuse(format!("the folder {} does not exist", target.folder.display())))
        }
        Err(e) => Err(refuse(format!("cannot be written there: {e}"))),
    }
}

/// A usage error naming `flag` when the output `out` is the file `other` (`what`: an input,
/// or another output), links and relative spellings resolved, either of them not there yet.
pub fn check_apart(flag: &str, out: &Path, what: &str, other: &Path) -> Result<()> {
    match (resolved(out), resolved(other)) {
        (Some(a), Some(b)) if a == b => Err(err!(
            Usage,
            "{flag} {}: names {what} {} itself: writing there would destroy it",
            out.display(),
            other.display()
        )),
        _ => Ok(()),
    }
}

/// Create (or empty) the log `path` to append lines to as a run goes (the metrics log). A
/// regular file is created or emptied; a pipe or device is written as it is. A FIFO is opened
/// without waiting, so one that no process reads is an error at once instead of a run that
/// blocks forever before its first step; then its writes wait for the reader as usual.
pub fn create_log(path: &Path) -> Result<fs::File> {
    let shown = path.display();
    let target = Target::of(path).map_err(|why| err!(Io, "{shown}: {why}"))?;
    let mut opts = fs::OpenOptions::new();
    opts.write(true);
    if !target.special {
        opts.create(true).truncate(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(|e| {
        #[cfg(unix)]
        if e.raw_os_error() == Some(libc::ENXIO) {
            return err!(Io, "{shown}: a FIFO that no process reads: start its reader first");
        }
        Error::io(&shown, e)
    })?;
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: F_GETFL/F_SETFL on a descriptor this function owns.
        unsafe {
            let fd = file.as_raw_fd();
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
            }
        }
    }
    Ok(file)
}

/// A random number from the standard library's per-process random hash keys.
fn unpredictable() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn create_exclusive(path: &Path) -> std::io::Result<fs::File> {
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    opts.open(path)
}

/// Remove `.<name>.<pid>.<random>.tmp` files in `folder` whose writing process is gone.
fn remove_stale_temps(folder: &Path, name: &str) {
    let Ok(entries) = fs::read_dir(folder) else { return };
    let prefix = format!(".{name}.");
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(&prefix)) else { continue };
        let Some((pid, random)) = rest.strip_suffix(".tmp").and_then(|r| r.split_once('.')) else {
            continue;
        };
        let ours = random.len() == 16 && random.bytes().all(|b| b.is_ascii_hexdigit());
        match pid.parse::<u32>() {
            Ok(pid) if ours && pid != std::process::id() && !process_alive(pid) => {
                let _ = fs::remove_file(entry.path());
            }
            _ => {}
        }
    }
}

#[cfg(unix)]
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(not(unix))]
fn process_alive(_pid: u32) -> bool {
    true // without a way to tell, another process's temporary file is left alone
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bytes` as a source file: its text, or its error rendered.
    fn check(bytes: &[u8], expected: &str) {
        let got = match source_from_bytes("f.rms".into(), bytes.to_vec()) {
            Ok(s) => s.text.clone(),
            Err(e) => e.to_string(),
        };
        assert_eq!(got, expected);
    }

    #[test]
    fn source_bytes_are_checked() {
        check(b"print(1);\n", "print(1);\n");
        // A UTF-8 byte-order mark is skipped; others are named.
        check(b"\xEF\xBB\xBFprint(1);", "print(1);");
        check(
            b"\xFF\xFEp\x00",
            "f.rms:1:1: the file starts with a UTF-16 little-endian byte-order mark; rumus reads UTF-8: save it as UTF-8\n    \u{FFFD}\u{FFFD}p\\0\n    ^",
        );
        check(
            b"\xFE\xFF\x00p",
            "f.rms:1:1: the file starts with a UTF-16 big-endian byte-order mark; rumus reads UTF-8: save it as UTF-8\n    \u{FFFD}\u{FFFD}\\0p\n    ^",
        );
        // The first bad byte, by line and column.
        check(
            b"print(1);\nlet a = \"\xFF\";\n",
            "f.rms:2:10: invalid UTF-8 (byte 0xFF): source files must be UTF-8 text\n    let a = \"\u{FFFD}\";\n             ^",
        );
        check(
            b"let \xC3\xA9 = \xC3;",
            "f.rms:1:9: invalid UTF-8 (byte 0xC3): source files must be UTF-8 text\n    let \u{e9} = \u{FFFD};\n            ^",
        );
    }

    #[test]
    fn devices_and_folders_are_refused() {
        let e = read_source(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/dev/zero: is not a regular file (a FIFO, socket or device); rumus reads files only"
        );
        let e = read_source(Path::new("src")).unwrap_err();
        assert_eq!(e.to_string(), "src: is a folder, not a file");
        let e = read_source(Path::new("")).unwrap_err();
        assert_eq!(e.to_string(), "the file name is empty");
    }

    #[test]
    fn a_source_file_over_the_limit_is_refused() {
        let dir = scratch("big");
        let path = dir.join("big.rms");
        fs::File::create(&path).unwrap().set_len(MAX_SOURCE_FILE_BYTES + 1).unwrap();
        let e = read_source(&path).unwrap_err();
        let expected = "a source file may have at most 16777216 bytes; this one has more";
        assert_eq!(e.to_string(), format!("{}: {expected}", path.display()));
    }

    /// A fresh directory for one test, removed with its contents when dropped.
    struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("rumus-files-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    /// A name of 255 bytes, the most a file system takes, is written (its temporary name held
    /// the whole name and 33 bytes more: "File name too long" from 223 bytes on), and one of
    /// 256 is an error naming the path.
    #[test]
    fn the_longest_file_names_can_be_written() {
        let dir = scratch("long");
        for name in ["a".repeat(255), format!("{}.st", "é".repeat(126))] {
            let path = dir.join(&name);
            write_atomic(&path, b"one").unwrap_or_else(|e| panic!("{e}"));
            write_atomic(&path, b"two").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(fs::read(&path).unwrap(), b"two");
            assert_eq!(names(&dir), std::slice::from_ref(&name));
            fs::remove_file(&path).unwrap();
        }
        let path = dir.join("b".repeat(256));
        let e = write_atomic(&path, b"x").unwrap_err();
        assert!(e.message.starts_with(&format!("{}: ", path.display())), "{}", e.message);
        assert!(e.message.contains("too long"), "{}", e.message);
        assert!(names(&dir).is_empty());
    }

    #[test]
    fn writes_replace_the_file_and_leave_nothing_else() {
        let dir = scratch("replace");
        let path = dir.join("out.txt");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(names(&dir), ["out.txt"]);
        let e = write_atomic(&dir, b"x").unwrap_err();
        assert_eq!(e.message, format!("{}: is a folder, not a file name", dir.display()));
    }

    /// Found by the hostile-input audit: `rumus plan --svg /dev/full`, run as root, renamed a
    /// regular file over the device (and `-o /dev/stdout` would have replaced the link).
    #[cfg(unix)]
    #[test]
    fn a_fifo_or_device_in_the_targets_place_is_refused_and_kept() {
        use std::os::unix::fs::FileTypeExt;
        let dir = scratch("special");
        let fifo = dir.join("out.svg");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let link = dir.join("link.svg");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        for path in [&fifo, &link] {
            let e = write_atomic(path, b"x").unwrap_err();
            let expected = "is not a regular file (a device, FIFO or socket); rumus writes files only";
            assert_eq!(e.message, format!("{}: {expected}", path.display()));
        }
        assert!(fs::metadata(&fifo).unwrap().file_type().is_fifo());
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(names(&dir), ["link.svg", "out.svg"]);
    }

    #[test]
    fn stale_temps_of_dead_processes_are_removed_and_others_kept() {
        let dir = scratch("stale");
        let dead = i32::MAX as u32; // above any pid_max
        let stale = format!(".out.txt.{dead}.00000000deadbeef.tmp");
        let live = format!(".out.txt.{}.0123456789abcdef.tmp", std::process::id());
        let other = format!(".out.txt.{dead}.notours.tmp");
        for f in [&stale, &live, &other] {
            fs::write(dir.join(f), "x").unwrap();
        }
        write_atomic(&dir.join("out.txt"), b"new").unwrap();
        let mut want = vec![live, other, "out.txt".to_string()];
        want.sort();
        assert_eq!(names(&dir), want);
    }
}
