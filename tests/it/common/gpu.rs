//! The GPU tests' access to the test devices: a device or a skip (a failure under `CI=true`),
//! and turns at it on adapters that cannot be shared between threads.

use rumus::runtime::{test_gpu, test_gpu_at_webgpu_limits, Gpu};
use rumus::Result;

/// A test's turn at the test devices, held until it is dropped. On OpenGL adapters wgpu shares
/// one context between threads and panics when a thread waits more than a few seconds for it
/// (a long shader compile or submission on a busy software adapter), so GPU tests take turns
/// there; elsewhere they run side by side. A thread that holds the turn may take it again (a
/// test calling a helper that takes it too).
pub struct GpuTurn(Option<std::sync::MutexGuard<'static, ()>>);

thread_local! {
    static HOLDS_TURN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl GpuTurn {
    fn take(gpu: &Gpu) -> GpuTurn {
        static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
        if gpu.info.backend != wgpu::Backend::Gl || HOLDS_TURN.with(|h| h.get()) {
            return GpuTurn(None);
        }
        let guard = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        HOLDS_TURN.with(|h| h.set(true));
        GpuTurn(Some(guard))
    }
}

impl Drop for GpuTurn {
    fn drop(&mut self) {
        if self.0.is_some() {
            HOLDS_TURN.with(|h| h.set(false));
        }
    }
}

/// For tests: the shared device and the test's turn at it (keep it alive as long as the test
/// uses the device), or `None` (after a notice on stderr) when there is no adapter, so the test
/// can return early. Under `CI=true` a missing adapter is a test failure instead: this panics
/// with the reason, because CI must exercise the WGSL path.
pub fn or_skip(test: &str) -> Option<(&'static Gpu, GpuTurn)> {
    let gpu = skip_unless_ci(test, test_gpu())?;
    Some((gpu, GpuTurn::take(gpu)))
}

/// For the tests of the emulated cooperative-matrix kernels (plain WGSL standing in for tensor
/// cores): [`or_skip`], and also `None` (after a notice on stderr) on Mesa's OpenGL adapter
/// even where the GPU tests run there ([`gl_wanted`]): llvmpipe compiles each of their
/// barrier-heavy modules there for 20 s to minutes (LLVM's coroutine splitting; 2026-12-02, 2
/// cores, cold shader cache: `gpu_coop`'s ragged-shapes test alone 512 s before the emulated
/// loop was kept a loop, 67 s after). They run on every Vulkan adapter (lavapipe in CI);
/// `RUMUS_TEST_GL_COOP=1` runs them on OpenGL too.
pub fn coop_or_skip(test: &str) -> Option<(&'static Gpu, GpuTurn)> {
    let (gpu, turn) = or_skip(test)?;
    let forced = std::env::var("RUMUS_TEST_GL_COOP").is_ok_and(|v| v == "1");
    if gpu.info.backend == wgpu::Backend::Gl && !forced {
        eprintln!(
            "note: skipping {test} on the OpenGL adapter: its emulated cooperative-matrix \
             modules take minutes each to compile there (they run on Vulkan, lavapipe \
             included; RUMUS_TEST_GL_COOP=1 runs them here)"
        );
        return None;
    }
    Some((gpu, turn))
}

/// For tests that run on the CPU backend and, where there is an adapter, on the GPU too: the
/// device names to run on, and the test's turn at the GPU (keep it alive while the test runs:
/// on OpenGL adapters a test that let it go shared the one context with other tests and wgpu
/// panicked waiting for it). A failure under `CI=true` without an adapter, as [`or_skip`] says.
pub fn devices_or_skip(test: &str) -> (Vec<&'static str>, GpuTurn) {
    match or_skip(test) {
        Some((_, turn)) => (vec!["cpu", "gpu"], turn),
        None => (vec!["cpu"], GpuTurn(None)),
    }
}

/// For tests: both test devices, the adapter's own limits first and WebGPU's defaults second
/// (`test_gpu_at_webgpu_limits`), with the test's turn at them; no device, or a failure under
/// `CI=true`, as [`or_skip`] says.
pub fn both_or_skip(test: &str) -> (Vec<&'static Gpu>, GpuTurn) {
    let Some(own) = skip_unless_ci(test, test_gpu()) else {
        return (Vec::new(), GpuTurn(None));
    };
    let turn = GpuTurn::take(own);
    let webgpu = skip_unless_ci(test, test_gpu_at_webgpu_limits());
    (std::iter::once(own).chain(webgpu).collect(), turn)
}

fn skip_unless_ci(test: &str, gpu: Result<&'static Gpu>) -> Option<&'static Gpu> {
    match gpu {
        Ok(gpu) if gpu.info.backend == wgpu::Backend::Gl && !gl_wanted() => {
            eprintln!(
                "note: skipping {test} on Mesa's OpenGL adapter: with its shader cache cold it \
                 compiles a test's shaders for minutes (RUMUS_TEST_GL=1 runs the GPU tests there)"
            );
            None
        }
        Ok(gpu) => Some(gpu),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: CI=true but no GPU device: {e} (install mesa-vulkan-drivers)")
        }
        Err(e) => {
            eprintln!("note: skipping {test}: {e}");
            None
        }
    }
}

/// Whether the GPU tests run on an OpenGL adapter (the only one on a machine without a Vulkan
/// driver): under `CI=true`, where `.ci/run` names the backend each pass must run on
/// (`RUMUS_EXPECT_BACKEND`), or when `RUMUS_TEST_GL=1` asks. Elsewhere they print a notice and
/// return there: Mesa's OpenGL path compiles the WGSL of a training test for minutes with its
/// shader cache cold (2026-12-02, 2 cores, `cargo nextest`: each of the two
/// `accumulate::*_micro_batches_*` tests 228 s; the whole suite takes 427 s on lavapipe with
/// its caches cold, about 80 s warm), so the README's `cargo test` on a machine without Vulkan
/// took hours.
fn gl_wanted() -> bool {
    let set = |name: &str, value: &str| std::env::var(name).is_ok_and(|v| v == value);
    set("CI", "true") || set("RUMUS_TEST_GL", "1") || std::env::var("RUMUS_EXPECT_BACKEND").is_ok()
}
