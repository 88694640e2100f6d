//! The driver's compiled pipelines, kept on disk between runs.
//!
//! Creating a pipeline makes the driver compile SPIR-V to machine code: up to a second for a
//! large kernel (a cooperative-matrix matmul), so a GPT plan of dozens of kernels would pay
//! seconds at every start. Where the adapter offers `Features::PIPELINE_CACHE` (Vulkan), every
//! pipeline is created through one `wgpu::PipelineCache` whose contents are saved after each
//! compile and loaded at the next device open.
//!
//! The file is the user's cache, not ours to trust: it may be truncated by a crash, edited, or
//! written by another driver version. So it is wrapped in our own header (a magic, the payload
//! length and a 64-bit FNV-1a hash of the payload) and anything that does not match is dropped
//! before the driver sees it, as is a file over `MAX_FILE_BYTES` or anything but a regular file
//! (a FIFO would block the open forever, `/dev/zero` would never end); wgpu then checks its own header (adapter and driver version) and
//! starts empty on a mismatch (`fallback: true`). Writes are atomic ([`write_atomic`]), and a
//! cache that cannot be read or written never fails a run: it only costs compile time.
//!
//! Where: `$RUMUS_CACHE_DIR`, else `$XDG_CACHE_HOME/rumus`, else `$HOME/.cache/rumus`; one
//! file per adapter (`wgpu::util::pipeline_cache_key`). `RUMUS_PIPELINE_CACHE=off` disables it.

use crate::error::Result;
use crate::files::write_atomic;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const MAGIC: &[u8; 8] = b"RUMUSPC1";
const HEADER: usize = 8 + 8 + 8;
/// Largest cache file read (a driver's cache of every pipeline of a large plan is a few MiB).
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// A `wgpu::PipelineCache` and the file it is saved to.
pub struct DiskCache {
    pub cache: wgpu::PipelineCache,
    path: PathBuf,
    /// The bytes last read or written, so an unchanged cache is not rewritten.
    saved: Mutex<Option<Vec<u8>>>,
}

/// Whether `RUMUS_PIPELINE_CACHE` leaves the cache on: unset, empty or `on`; `off` turns it
/// off, and anything else is a usage error (a mistyped `of` used to leave it on silently).
pub fn enabled() -> Result<bool> {
    crate::error::env_choice(SWITCH, SETTINGS)
}

const SWITCH: &str = "RUMUS_PIPELINE_CACHE";
const SETTINGS: &[(&str, bool)] = &[("on", true), ("off", false)];

impl DiskCache {
    /// The cache for `device` on the adapter `info`, loaded from its file where that holds a
    /// valid one; `None` where the device has no pipeline cache or caching is off
    /// ([`enabled`], read before the device opened).
    pub fn open(device: &wgpu::Device, info: &wgpu::AdapterInfo, enabled: bool) -> Option<DiskCache> {
        if !enabled || !device.features().contains(wgpu::Features::PIPELINE_CACHE) {
            return None;
        }
        let path = cache_dir()?.join("pipelines").join(wgpu::util::pipeline_cache_key(info)?);
        Some(DiskCache::at(device, path))
    }

    /// The cache saved at `path` (which need not exist).
    pub fn at(device: &wgpu::Device, path: PathBuf) -> DiskCache {
        let data = read(&path, MAX_FILE_BYTES).and_then(|bytes| unwrap(&bytes).map(<[u8]>::to_vec));
        // SAFETY: wgpu checks the data's header (adapter, driver version) and, with `fallback`,
        // starts an empty cache when it does not match; the payload is exactly what the driver
        // gave us earlier, as our own header's length and hash confirm.
        let cache = unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("rumus pipelines"),
                data: data.as_deref(),
                fallback: true,
            })
        };
        DiskCache { cache, path, saved: Mutex::new(data) }
    }

    /// Write the cache's contents to its file if they changed. Failures are ignored: the cache
    /// only saves time.
    pub fn save(&self) {
        let Some(data) = self.cache.get_data() else { return };
        let Ok(mut saved) = self.saved.lock() else { return };
        if saved.as_deref() == Some(&data[..]) {
            return;
        }
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if write_atomic(&self.path, &wrap(&data)).is_ok() {
            *saved = Some(data);
        }
    }

    /// The file the cache is saved to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn cache_dir() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("RUMUS_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("rumus")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("rumus")))
}

/// The bytes of the regular file at `path` if it has at most `max`.
fn read(path: &Path, max: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    let file = crate::files::open_regular(path).ok()?;
    if file.metadata().ok()?.len() > max {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes).ok()?;
    (bytes.len() as u64 <= max).then_some(bytes)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// `payload` behind our header.
fn wrap(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a file [`wrap`] wrote, or `None` for anything else (wrong magic, truncated,
/// extended, or a payload whose hash does not match).
fn unwrap(file: &[u8]) -> Option<&[u8]> {
    let (header, payload) = file.split_at_checked(HEADER)?;
    let word = |i: usize| header.get(i..i + 8)?.try_into().ok().map(u64::from_le_bytes);
    (header.starts_with(MAGIC)
        && word(8)? == payload.len() as u64
        && word(16)? == fnv1a(payload))
    .then_some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_is_on_or_off_and_nothing_else() {
        let parse = |v| crate::error::choose(SWITCH, v, SETTINGS);
        for (v, on) in [(None, true), (Some(""), true), (Some("on"), true), (Some(" off "), false)] {
            assert_eq!(parse(v).unwrap(), on, "{v:?}");
        }
        let e = parse(Some("of")).unwrap_err();
        assert_eq!(e.message, "RUMUS_PIPELINE_CACHE: `of` is not `on` (the default) or `off`");
        let e = parse(Some("\u{1b}[2J")).unwrap_err();
        assert_eq!(
            e.message,
            "RUMUS_PIPELINE_CACHE: `\\u{1b}[2J` is not `on` (the default) or `off`"
        );
    }

    /// Found by the hostile-input audit: a FIFO at the cache's path blocked every GPU run in
    /// `open`, and a link to `/dev/zero` read until memory ran out.
    #[cfg(unix)]
    #[test]
    fn only_regular_files_of_bounded_size_are_read() {
        let dir = std::env::temp_dir().join(format!("rumus-pc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert_eq!(read(&fifo, MAX_FILE_BYTES), None);
        assert_eq!(read(Path::new("/dev/zero"), MAX_FILE_BYTES), None);
        assert_eq!(read(&dir, MAX_FILE_BYTES), None);
        let good = dir.join("good");
        write_atomic(&good, &wrap(b"payload")).unwrap();
        let size = (HEADER + 7) as u64;
        assert_eq!(read(&good, size).as_deref().and_then(unwrap), Some(&b"payload"[..]));
        assert_eq!(read(&good, size - 1), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_wrapped_payload_comes_back_and_any_damage_is_refused() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let file = wrap(&payload);
        assert_eq!(unwrap(&file), Some(&payload[..]));
        assert_eq!(unwrap(&wrap(&[])), Some(&[][..]));

        let mut flipped = file.clone();
        flipped[HEADER + 500] ^= 1;
        let mut extended = file.clone();
        extended.push(0);
        let mut other_magic = file.clone();
        other_magic[0] = b'X';
        let damaged: [(&str, &[u8]); 6] = [
            ("empty", &[]),
            ("header only, cut", &file[..HEADER - 1]),
            ("truncated payload", &file[..file.len() - 1]),
            ("extended", &extended),
            ("a flipped bit", &flipped),
            ("another magic", &other_magic),
        ];
        for (what, bytes) in damaged {
            assert_eq!(unwrap(bytes), None, "{what}");
        }
    }
}
