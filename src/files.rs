//! Writing files safely: [`write_atomic`] is the one way rumus writes a file a script or a host
//! names (checkpoints, `write_text`).
//!
//! The bytes go to a new temporary file in the target's own folder, created exclusively
//! (`O_CREAT | O_EXCL`, and `O_NOFOLLOW` where there is one) under a name nobody can predict, so
//! a planted file or symbolic link can neither redirect nor pre-empt the write. The file is
//! flushed to disk and renamed over the target: a crash leaves the old file or the new one,
//! never half of one. Temporary files that an earlier, killed write to the same target left
//! behind are removed by the next write; every failure is an error.
//!
//! The one other file rumus writes is the metrics log (`rumus run --metrics`), appended line by
//! line as the run goes so that it can be followed and a killed run keeps its lines;
//! `tests/it/script_writes.rs` checks that no other code creates, overwrites or renames files.

use crate::err;
use crate::error::{Error, Result};
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Write `bytes` to `path` atomically (see the module documentation). `path` must name a file
/// (not a folder) in an existing folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let shown = path.display();
    let name = match path.file_name() {
        Some(n) if !path.is_dir() => n.to_string_lossy().into_owned(),
        _ => return Err(err!(Io, "{shown}: is a folder, not a file name")),
    };
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    remove_stale_temps(&folder, &name);
    let tmp = folder.join(format!(".{name}.{}.{:016x}.tmp", std::process::id(), unpredictable()));
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
    if let Ok(dir) = fs::File::open(&folder) {
        let _ = dir.sync_all();
    }
    Ok(())
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

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rumus-files-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
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
