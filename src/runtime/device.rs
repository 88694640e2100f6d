//! The wgpu device: choosing an adapter, asking for its own limits, and turning every failure
//! (validation, out of memory, limits) into an [`Error`] of kind `Device` instead of a panic.
//!
//! Owns [`DeviceChoice`] (the `--device` / `RUMUS_DEVICE` setting), [`Gpu`] (adapter info, device,
//! queue, limits, cooperative matrices) with its buffer / pipeline / readback helpers, the
//! matmul precision a device runs ([`Gpu::matmul_precision`]), [`Dispatch`] (one prepared
//! compute dispatch), and [`test_gpu`], the one device shared by every test in a process.
//!
//! Rules every caller can rely on:
//! - a buffer is checked against `max_buffer_size` (and, for storage buffers, against
//!   `max_storage_buffer_binding_size`) before wgpu is asked for it, so an oversized request is an
//!   `Err` and the device stays usable;
//! - buffer, pipeline and bind-group creation and every submission run inside error scopes;
//! - errors that escape all scopes go to a non-panicking handler and are reported by
//!   [`Gpu::take_uncaptured_errors`].

use super::pipeline_cache::DiskCache;
use crate::codegen::{MatmulOptions, MatmulPrecision, ShaderChecks, Target};
use crate::err;
use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// How long [`Gpu::map_after`] waits for a map callback once its submission is done.
const MAP_CALLBACK_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Which device runs the plans: the `--device` flag and the `RUMUS_DEVICE` variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// A hardware GPU adapter (device type other than `Cpu`) if there is one, else the CPU backend.
    #[default]
    Auto,
    /// Any wgpu adapter, software ones (Mesa lavapipe) included; an error when there is none.
    Gpu,
    /// The CPU backend; wgpu is not touched.
    Cpu,
}

impl DeviceChoice {
    /// The names `FromStr` accepts.
    pub const NAMES: [&'static str; 3] = ["auto", "gpu", "cpu"];

    /// The choice from `RUMUS_DEVICE`; `Auto` when the variable is unset or empty, an error
    /// when it is not text (it would otherwise read as unset).
    pub fn from_env() -> Result<DeviceChoice> {
        let text = crate::error::env_text("RUMUS_DEVICE")
            .map_err(|e| err!(Usage, "{} (valid choices: auto, gpu, cpu)", e.message))?;
        match text {
            Some(v) if !v.trim().is_empty() => {
                v.parse().map_err(|e: Error| err!(Usage, "RUMUS_DEVICE: {}", e.message))
            }
            _ => Ok(DeviceChoice::Auto),
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<DeviceChoice> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "gpu" => Ok(DeviceChoice::Gpu),
            "cpu" => Ok(DeviceChoice::Cpu),
            _ => Err(err!(
                Usage,
                "unknown device `{s}` (valid choices: {})",
                DeviceChoice::NAMES.join(", ")
            )),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Gpu => "gpu",
            DeviceChoice::Cpu => "cpu",
        };
        f.write_str(name)
    }
}

/// An open wgpu device with the adapter's own limits.
pub struct Gpu {
    /// Name, vendor, device type and backend of the adapter.
    pub info: wgpu::AdapterInfo,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// The limits the device was created with (the adapter's own unless asked otherwise).
    pub limits: wgpu::Limits,
    /// The subgroup size, when the device was opened with 16x16x16 f16 x f16 -> f32
    /// cooperative matrices (and the adapter has one subgroup size): the `high` and `medium`
    /// matmul kernels run only then.
    pub cooperative: Option<u32>,
    /// The alignment of host memory the device imports (`VK_EXT_external_memory_host`,
    /// [`super::host_memory`]), when it was opened with the extension.
    pub host_import: Option<u64>,
    /// Errors no error scope caught, recorded by the non-panicking handler.
    uncaptured: Arc<Mutex<Vec<String>>>,
    /// Compiled pipelines kept on disk between runs, where the adapter can.
    pipeline_cache: Option<DiskCache>,
    /// Whose turn at the device it is, on wgpu's OpenGL backend ([`Gpu::turn`]): the next
    /// ticket to give out and the ticket served.
    turns: Mutex<(u64, u64)>,
    /// Signalled when a turn ends.
    turn_ended: std::sync::Condvar,
}

/// A turn at the device ([`Gpu::turn`]), ended when dropped.
pub struct Turn<'a>(&'a Gpu);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut turns = self.0.turns.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        turns.1 += 1;
        self.0.turn_ended.notify_all();
    }
}

/// One prepared compute dispatch: a pipeline, its bind group (group 0) and the workgroup grid.
/// Built once (at plan compile time), encoded into a pass every step.
pub struct Dispatch {
    pub label: String,
    pub pipeline: wgpu::ComputePipeline,
    pub bind_group: wgpu::BindGroup,
    pub workgroups: [u32; 3],
    /// Buffers only this dispatch uses (its uniform parameters), kept alive with it.
    pub owned: Vec<wgpu::Buffer>,
}

impl Dispatch {
    /// Record this dispatch into `pass`.
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        let [x, y, z] = self.workgroups;
        pass.dispatch_workgroups(x, y, z);
    }
}

/// Copies encoded by [`Gpu::encode_readback`], waiting for their submission.
pub struct Readback {
    staging: Option<wgpu::Buffer>,
    /// Byte range of each part in `staging`.
    spans: Vec<std::ops::Range<u64>>,
}

impl Readback {
    /// Encode into `enc` the copies of the parts `pick` selects (by index), `parts` being
    /// those the readback was made for.
    pub fn encode(
        &self,
        enc: &mut wgpu::CommandEncoder,
        parts: &[(&wgpu::Buffer, std::ops::Range<usize>)],
        pick: impl Fn(usize) -> bool,
    ) {
        let Some(staging) = &self.staging else { return };
        for (i, ((buf, range), span)) in parts.iter().zip(&self.spans).enumerate() {
            if pick(i) && !span.is_empty() {
                let start = range.start as u64 * 4;
                enc.copy_buffer_to_buffer(buf, start, staging, span.start, span.end - span.start);
            }
        }
    }
}

/// Usage of a plain storage buffer: bindable read-write, copyable both ways.
pub const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_DST)
    .union(wgpu::BufferUsages::COPY_SRC);

/// Split `n` workgroups into a grid no dimension of which exceeds `max_per_dim`, with as little
/// excess as possible. Kernels recover the linear id as `x + nx * (y + ny * z)` and must ignore
/// ids `>= n` (the grid may hold a few more than `n`). Needs `n <= max_per_dim³`, which always
/// holds for the WebGPU minimum of 65535.
pub fn split_workgroups(n: u32, max_per_dim: u32) -> [u32; 3] {
    let max = max_per_dim.max(1);
    if n <= max {
        return [n, 1, 1];
    }
    let rows = n.div_ceil(max);
    let x = n.div_ceil(rows);
    if rows <= max {
        return [x, rows, 1];
    }
    let z = rows.div_ceil(max);
    [x, rows.div_ceil(z), z]
}

impl Gpu {
    /// Open the device `choice` asks for: `Ok(None)` for `Cpu`, and for `Auto` when there is no
    /// hardware adapter; an error for `Gpu` when wgpu finds no adapter at all.
    pub fn open(choice: DeviceChoice) -> Result<Option<Gpu>> {
        Gpu::open_with(choice, |adapter| adapter)
    }

    /// [`Gpu::open`] with the limits `limits` makes of the adapter's own (which it must not
    /// exceed).
    pub fn open_with(
        choice: DeviceChoice,
        limits: impl FnOnce(wgpu::Limits) -> wgpu::Limits,
    ) -> Result<Option<Gpu>> {
        let hardware_only = match choice {
            DeviceChoice::Cpu => return Ok(None),
            DeviceChoice::Auto => true,
            DeviceChoice::Gpu => false,
        };
        // Settings are checked before any adapter is looked for, so a mistyped one is refused
        // the same way on every machine.
        super::pipeline_cache::enabled()?;
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        let mut usable: Vec<wgpu::Adapter> = adapters
            .into_iter()
            .filter(|a| !hardware_only || a.get_info().device_type != wgpu::DeviceType::Cpu)
            .collect();
        // Among the adapters of the best kind, the process with local rank r takes the r-th
        // (wrapping), so the ranks of a data-parallel job on one machine take a GPU each.
        let top = usable.iter().map(|a| adapter_rank(&a.get_info())).min();
        usable.retain(|a| Some(adapter_rank(&a.get_info())) == top);
        let best = match usable.len() {
            0 => None,
            n => Some(usable.swap_remove(LOCAL_RANK.load(Ordering::Relaxed) % n)),
        };
        match best {
            Some(adapter) => {
                let limits = limits(adapter.limits());
                Gpu::from_adapter_with_limits(adapter, limits).map(Some)
            }
            None if hardware_only => Ok(None),
            None => Err(err!(
                Device,
                "no wgpu adapter found (install a Vulkan driver, e.g. mesa-vulkan-drivers, or use --device cpu)"
            )),
        }
    }

    /// Create the device on `adapter` with the adapter's own limits and a non-panicking
    /// uncaptured-error handler.
    pub fn from_adapter(adapter: wgpu::Adapter) -> Result<Gpu> {
        let limits = adapter.limits();
        Gpu::from_adapter_with_limits(adapter, limits)
    }

    /// Create the device on `adapter` with `limits` (at most the adapter's own) and a
    /// non-panicking uncaptured-error handler.
    pub fn from_adapter_with_limits(adapter: wgpu::Adapter, limits: wgpu::Limits) -> Result<Gpu> {
        let cache_on = super::pipeline_cache::enabled()?;
        let info = adapter.get_info();
        let mut features = adapter.features() & (wgpu::Features::SHADER_F16 | wgpu::Features::PIPELINE_CACHE);
        let cooperative = cooperative_subgroup(&adapter);
        if cooperative.is_some() {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some("rumus"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: if cooperative.is_some() {
                // SAFETY: cooperative matrices are used only by codegen's matmul kernels, whose
                // every module naga validates (`tests/it/codegen_valid.rs`) and which keep
                // their operations in uniform control flow.
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        };
        // Where the adapter can import host memory the device is opened with that extension
        // (data-parallel training's exchange between the GPUs of a machine needs it); else, or
        // when that fails, as wgpu opens it.
        let (device, queue, host_import) = match super::host_memory::open(&adapter, &desc) {
            Some((device, queue, align)) => (device, queue, Some(align)),
            None => {
                let (device, queue) = pollster::block_on(adapter.request_device(&desc)).map_err(
                    |e| err!(Device, "cannot open device on adapter `{}`: {e}", info.name),
                )?;
                (device, queue, None)
            }
        };
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(error_text(&e));
            }
        }));
        let limits = device.limits();
        let pipeline_cache = DiskCache::open(&device, &info, cache_on);
        let (turns, turn_ended) = (Mutex::new((0, 0)), std::sync::Condvar::new());
        Ok(Gpu {
            info,
            device,
            queue,
            limits,
            cooperative,
            host_import,
            uncaptured,
            pipeline_cache,
            turns,
            turn_ended,
        })
    }

    /// The calling thread's turn at the device, held until the guard is dropped: on wgpu's
    /// OpenGL backend one caller at a time (`None` elsewhere, where threads share a device
    /// freely). There every call waits for the one context the backend shares between
    /// threads and panics after 6 s (`Could not lock adapter context`), which a thread
    /// reaches while another compiles or runs a step on a software adapter: two engines on
    /// two threads crashed the process. Taken by each entry point of [`super::backend::GpuBackend`]
    /// (not reentrant: code under a turn must not take it again), the wait is here instead,
    /// without a limit, and turns are taken in the order they were asked for (a thread
    /// stepping in a loop does not starve one waiting to compile).
    pub fn turn(&self) -> Option<Turn<'_>> {
        if self.info.backend != wgpu::Backend::Gl {
            return None;
        }
        let poisoned = std::sync::PoisonError::into_inner;
        let mut turns = self.turns.lock().unwrap_or_else(poisoned);
        let ticket = turns.0;
        turns.0 += 1;
        while turns.1 != ticket {
            turns = self.turn_ended.wait(turns).unwrap_or_else(poisoned);
        }
        Some(Turn(self))
    }

    /// What codegen needs to know of this device, with the matmul choices `matmul`.
    pub fn target(&self, matmul: MatmulOptions) -> Target {
        Target::of(&self.limits, self.cooperative, matmul, self.is_software())
    }

    /// The matmul precision this device runs when `requested` (`None`: the default) is asked
    /// for (see [`MatmulPrecision::resolve`]), announced on stderr in one line, once per
    /// process and line.
    pub fn matmul_precision(&self, requested: Option<MatmulPrecision>) -> MatmulPrecision {
        let (mode, line) = precision_note(requested, self.cooperative.is_some(), &self.info.name);
        note_once(&line);
        mode
    }

    /// One line describing the adapter, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Cpu, Vulkan)`.
    pub fn describe(&self) -> String {
        format!("{} ({:?}, {:?})", self.info.name, self.info.device_type, self.info.backend)
    }

    /// Whether this is a software adapter (lavapipe and the like).
    pub fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// Errors that escaped every error scope since the last call (and clears them).
    pub fn take_uncaptured_errors(&self) -> Vec<String> {
        self.uncaptured.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default()
    }

    /// Run `f` inside validation, out-of-memory and internal error scopes; any error becomes an
    /// [`Error`] of kind `Device` that starts with `what`.
    pub fn scoped<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        let errors = [validation.pop(), internal.pop(), oom.pop()];
        for e in errors {
            if let Some(e) = pollster::block_on(e) {
                return Err(err!(Device, "{what}: {}", error_text(&e)));
            }
        }
        Ok(out)
    }

    /// Check that a buffer of `size` bytes with `usage` fits the device limits.
    pub fn check_buffer_size(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<()> {
        if size > self.limits.max_buffer_size {
            return Err(err!(
                Device,
                "buffer `{label}` of {size} bytes exceeds the device's max_buffer_size of {} bytes",
                self.limits.max_buffer_size
            ));
        }
        if usage.contains(wgpu::BufferUsages::STORAGE)
            && size > self.limits.max_storage_buffer_binding_size
        {
            return Err(err!(
                Device,
                "storage buffer `{label}` of {size} bytes exceeds the device's \
                 max_storage_buffer_binding_size of {} bytes",
                self.limits.max_storage_buffer_binding_size
            ));
        }
        if usage.contains(wgpu::BufferUsages::UNIFORM)
            && size > self.limits.max_uniform_buffer_binding_size
        {
            return Err(err!(
                Device,
                "uniform buffer `{label}` of {size} bytes exceeds the device's \
                 max_uniform_buffer_binding_size of {} bytes",
                self.limits.max_uniform_buffer_binding_size
            ));
        }
        Ok(())
    }

    /// A buffer of at least `size` bytes (rounded up to a multiple of 4, and at least 4, so every
    /// buffer can be bound and copied), checked against the limits first.
    pub fn buffer(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        let size = size.max(4).checked_next_multiple_of(4).ok_or_else(|| {
            err!(Device, "buffer `{label}` of {size} bytes exceeds the device's max_buffer_size")
        })?;
        self.check_buffer_size(label, size, usage)?;
        let desc =
            wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: false };
        self.scoped(&format!("cannot create buffer `{label}` of {size} bytes"), || {
            self.device.create_buffer(&desc)
        })
    }

    /// A storage buffer of `len` 4-byte elements (f32 or i32), contents unspecified.
    pub fn storage(&self, label: &str, len: usize) -> Result<wgpu::Buffer> {
        let size = (len as u64).checked_mul(4).ok_or_else(|| {
            err!(Device, "buffer `{label}` of {len} elements exceeds the device's max_buffer_size")
        })?;
        self.buffer(label, size, STORAGE)
    }

    /// A storage buffer holding `data`.
    pub fn upload_f32(&self, label: &str, data: &[f32]) -> Result<wgpu::Buffer> {
        let buf = self.storage(label, data.len())?;
        self.write(&buf, 0, bytemuck::cast_slice(data))?;
        Ok(buf)
    }

    /// A storage buffer holding `data`.
    pub fn upload_i32(&self, label: &str, data: &[i32]) -> Result<wgpu::Buffer> {
        let buf = self.storage(label, data.len())?;
        self.write(&buf, 0, bytemuck::cast_slice(data))?;
        Ok(buf)
    }

    /// A uniform buffer holding `bytes` (a `#[repr(C)]` parameter struct, 16-byte padded).
    pub fn uniform(&self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer> {
        let usage = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
        let size = (bytes.len() as u64).max(16).next_multiple_of(16);
        let buf = self.buffer(label, size, usage)?;
        self.write(&buf, 0, bytes)?;
        Ok(buf)
    }

    /// Write `bytes` into `buf` at byte `offset` (both multiples of 4).
    pub fn write(&self, buf: &wgpu::Buffer, offset: u64, bytes: &[u8]) -> Result<()> {
        let end = offset.checked_add(bytes.len() as u64);
        if !offset.is_multiple_of(4)
            || !bytes.len().is_multiple_of(4)
            || end.is_none_or(|e| e > buf.size())
        {
            return Err(err!(
                Device,
                "cannot write {} bytes at offset {offset} into a buffer of {} bytes",
                bytes.len(),
                buf.size()
            ));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.scoped("cannot write buffer", || self.queue.write_buffer(buf, offset, bytes))
    }

    /// Write f32 elements into `buf` starting at element `offset`.
    pub fn write_f32(&self, buf: &wgpu::Buffer, offset: usize, data: &[f32]) -> Result<()> {
        self.write(buf, offset as u64 * 4, bytemuck::cast_slice(data))
    }

    /// Read the whole buffer back as f32 elements.
    pub fn read_f32(&self, buf: &wgpu::Buffer) -> Result<Vec<f32>> {
        self.read_f32_range(buf, 0..(buf.size() / 4) as usize)
    }

    /// Read elements `range` (in 4-byte elements) back as f32.
    pub fn read_f32_range(
        &self,
        buf: &wgpu::Buffer,
        range: std::ops::Range<usize>,
    ) -> Result<Vec<f32>> {
        let bytes = self.read_bytes(buf, range)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Read the whole buffer back as i32 elements.
    pub fn read_i32(&self, buf: &wgpu::Buffer) -> Result<Vec<i32>> {
        self.read_i32_range(buf, 0..(buf.size() / 4) as usize)
    }

    /// Read elements `range` (in 4-byte elements) back as i32.
    pub fn read_i32_range(
        &self,
        buf: &wgpu::Buffer,
        range: std::ops::Range<usize>,
    ) -> Result<Vec<i32>> {
        let bytes = self.read_bytes(buf, range)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Copy elements `range` of `buf` into a mappable staging buffer, wait, and return the bytes.
    fn read_bytes(&self, buf: &wgpu::Buffer, range: std::ops::Range<usize>) -> Result<Vec<u8>> {
        let mut enc = self.device.create_command_encoder(&Default::default());
        let readback = self.encode_readback(&mut enc, &[(buf, range)])?;
        self.submit(enc)?;
        Ok(self.finish_readback(readback)?.pop().unwrap_or_default())
    }

    /// Encode copies of element ranges of buffers into one mappable staging buffer, so that they
    /// are read back with the work `enc` holds (one submission); [`Gpu::finish_readback`]
    /// returns their bytes after `enc` is submitted.
    pub fn encode_readback(
        &self,
        enc: &mut wgpu::CommandEncoder,
        parts: &[(&wgpu::Buffer, std::ops::Range<usize>)],
    ) -> Result<Readback> {
        let readback = self.readback(parts)?;
        readback.encode(enc, parts, |_| true);
        Ok(readback)
    }

    /// The staging buffer for reading element ranges `parts` of buffers back, to be copied
    /// into with [`Readback::encode`] (all parts in one place, or in several places of a
    /// command stream).
    pub fn readback(&self, parts: &[(&wgpu::Buffer, std::ops::Range<usize>)]) -> Result<Readback> {
        let mut spans = Vec::with_capacity(parts.len());
        let mut total = 0u64;
        for (buf, range) in parts {
            let (start, end) = (range.start as u64 * 4, range.end as u64 * 4);
            if start > end || end > buf.size() {
                return Err(err!(
                    Device,
                    "cannot read elements {}..{} of a buffer of {} elements",
                    range.start,
                    range.end,
                    buf.size() / 4
                ));
            }
            spans.push(total..total + (end - start));
            total += end - start;
        }
        if total == 0 {
            return Ok(Readback { staging: None, spans });
        }
        let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let staging = self.buffer("readback", total, usage)?;
        Ok(Readback { staging: Some(staging), spans })
    }

    /// Wait for a readback's submission and return the bytes of each part, in order.
    pub fn finish_readback(&self, readback: Readback) -> Result<Vec<Vec<u8>>> {
        let Readback { staging, spans } = readback;
        let Some(staging) = staging else {
            return Ok(spans.iter().map(|_| Vec::new()).collect());
        };
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(err!(Device, "cannot map readback buffer: {e}")),
            Err(_) => return Err(err!(Device, "readback buffer was never mapped")),
        }
        let parts = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| err!(Device, "cannot read mapped buffer: {e}"))?;
            spans.iter().map(|s| view[s.start as usize..s.end as usize].to_vec()).collect()
        };
        staging.unmap();
        Ok(parts)
    }

    /// Map each of `bufs` for its mode, blocking until submission `index` (the last that uses
    /// them) is done.
    pub fn map_after(
        &self,
        bufs: &[(&wgpu::Buffer, wgpu::MapMode)],
        index: wgpu::SubmissionIndex,
    ) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        for (buf, mode) in bufs {
            let tx = tx.clone();
            buf.map_async(*mode, .., move |r| {
                let _ = tx.send(r);
            });
        }
        self.wait_for(index)?;
        // The submission is done, but the callbacks may not have run yet: another thread that
        // polls the same device (two ranks of one process) can have taken them and run them
        // just after this poll returns. So wait for them, not just look.
        for _ in bufs {
            match rx.recv_timeout(MAP_CALLBACK_WAIT) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(err!(Device, "cannot map a staging buffer: {e}")),
                Err(_) => {
                    return Err(err!(
                        Device,
                        "a staging buffer was not mapped within {} s of its submission's end",
                        MAP_CALLBACK_WAIT.as_secs()
                    ))
                }
            }
        }
        Ok(())
    }

    /// Compile `wgsl` and create a compute pipeline for `entry` with an automatic layout (bind
    /// group 0 then holds exactly the bindings the entry point uses). Invalid WGSL is an `Err`
    /// carrying naga's message.
    pub fn pipeline(&self, label: &str, wgsl: &str, entry: &str) -> Result<wgpu::ComputePipeline> {
        self.pipeline_with(label, wgsl, entry, ShaderChecks::ALL)
    }

    /// [`Gpu::pipeline`] with naga's runtime checks as `checks` says.
    pub fn pipeline_with(
        &self,
        label: &str,
        wgsl: &str,
        entry: &str,
        checks: ShaderChecks,
    ) -> Result<wgpu::ComputePipeline> {
        self.scoped(&format!("cannot build pipeline `{label}`"), || {
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(wgsl.into()),
            };
            let module = if checks == ShaderChecks::ALL {
                self.device.create_shader_module(desc)
            } else {
                let runtime_checks = wgpu::ShaderRuntimeChecks {
                    bounds_checks: checks.bounds,
                    force_loop_bounding: checks.loop_bounding,
                    ..wgpu::ShaderRuntimeChecks::checked()
                };
                // SAFETY: codegen turns a check off only for a kernel whose every access is in
                // bounds and whose every loop ends (`codegen::ShaderChecks`).
                unsafe { self.device.create_shader_module_trusted(desc, runtime_checks) }
            };
            self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(label),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: self.pipeline_cache.as_ref().map(|c| &c.cache),
            })
        })
    }

    /// Save the pipelines compiled so far to the on-disk cache, where there is one
    /// ([`DiskCache`]); never fails.
    pub fn save_pipeline_cache(&self) {
        if let Some(c) = &self.pipeline_cache {
            c.save();
        }
    }

    /// The file compiled pipelines are kept in between runs, where there is one.
    pub fn pipeline_cache_file(&self) -> Option<&std::path::Path> {
        self.pipeline_cache.as_ref().map(DiskCache::path)
    }

    /// A bind group for group 0 of `pipeline` with `buffers[i]` (whole) at binding `i`.
    pub fn bind_group(
        &self,
        label: &str,
        pipeline: &wgpu::ComputePipeline,
        buffers: &[&wgpu::Buffer],
    ) -> Result<wgpu::BindGroup> {
        let numbered: Vec<(u32, &wgpu::Buffer)> =
            buffers.iter().enumerate().map(|(i, b)| (i as u32, *b)).collect();
        self.bind_group_at(label, pipeline, &numbered)
    }

    /// A bind group for group 0 of `pipeline` with each `(binding, buffer)` (whole buffer).
    pub fn bind_group_at(
        &self,
        label: &str,
        pipeline: &wgpu::ComputePipeline,
        buffers: &[(u32, &wgpu::Buffer)],
    ) -> Result<wgpu::BindGroup> {
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .map(|&(binding, b)| wgpu::BindGroupEntry { binding, resource: b.as_entire_binding() })
            .collect();
        self.scoped(&format!("cannot bind buffers of `{label}`"), || {
            let layout = pipeline.get_bind_group_layout(0);
            self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(label),
                layout: &layout,
                entries: &entries,
            })
        })
    }

    /// A grid of at most `max_compute_workgroups_per_dimension` per axis holding `n_workgroups`
    /// (see [`split_workgroups`]).
    pub fn dispatch_dims(&self, n_workgroups: u32) -> [u32; 3] {
        split_workgroups(n_workgroups, self.limits.max_compute_workgroups_per_dimension)
    }

    /// Check a grid against `max_compute_workgroups_per_dimension`.
    pub fn check_grid(&self, what: &str, grid: [u32; 3]) -> Result<()> {
        let max = self.limits.max_compute_workgroups_per_dimension;
        if grid.iter().any(|&g| g > max) {
            return Err(err!(
                Device,
                "{what}: workgroup grid {grid:?} exceeds the device's {max} workgroups per dimension"
            ));
        }
        Ok(())
    }

    /// Encode `dispatches` in order into one compute pass, submit once, and wait.
    pub fn run(&self, dispatches: &[&Dispatch]) -> Result<()> {
        let mut enc = self.device.create_command_encoder(&Default::default());
        self.encode(&mut enc, dispatches);
        self.submit(enc)?;
        self.wait()
    }

    /// Encode `dispatches` in order into one compute pass of `enc`.
    pub fn encode(&self, enc: &mut wgpu::CommandEncoder, dispatches: &[&Dispatch]) {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("rumus"),
            timestamp_writes: None,
        });
        for d in dispatches {
            d.encode(&mut pass);
        }
    }

    /// Finish and submit `enc` inside error scopes.
    pub fn submit(&self, enc: wgpu::CommandEncoder) -> Result<wgpu::SubmissionIndex> {
        self.scoped("submission failed", || self.queue.submit([enc.finish()]))
    }

    /// Block until submission `index` (and every one before it) is done.
    pub fn wait_for(&self, index: wgpu::SubmissionIndex) -> Result<()> {
        let wait = wgpu::PollType::Wait { submission_index: Some(index), timeout: None };
        self.device.poll(wait).map(|_| ()).map_err(|e| err!(Device, "waiting for the device failed: {e}"))
    }

    /// Block until all submitted work is done.
    pub fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| err!(Device, "waiting for the device failed: {e}"))
    }
}

/// Lower is better: discrete, integrated, virtual, other, software; native backends before GL.
fn adapter_rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let device = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let backend = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    };
    (device, backend)
}

/// The subgroup size of `adapter` when it offers cooperative matrices the matmul kernels can
/// use: the feature with f16, a 16x16x16 configuration with f16 A and B and an f32
/// accumulator, and a single subgroup size (the kernels' workgroups are whole subgroups).
fn cooperative_subgroup(adapter: &wgpu::Adapter) -> Option<u32> {
    use wgpu::wgt::CooperativeScalarType as T;
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    if !adapter.features().contains(needed) {
        return None;
    }
    let f16 = adapter.cooperative_matrix_properties().iter().any(|p| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16) && p.ab_type == T::F16 && p.cr_type == T::F32
    });
    let info = adapter.get_info();
    let size = info.subgroup_min_size;
    (f16 && size > 0 && size == info.subgroup_max_size).then_some(size)
}

/// The mode [`MatmulPrecision::resolve`] gives and the one-line notice that announces it on
/// adapter `adapter`.
pub fn precision_note(
    requested: Option<MatmulPrecision>,
    cooperative: bool,
    adapter: &str,
) -> (MatmulPrecision, String) {
    let (mode, fell_back) = MatmulPrecision::resolve(requested, cooperative);
    let line = match (requested, fell_back) {
        (Some(asked), true) => format!(
            "note: matmul precision {asked} needs cooperative matrices, which `{adapter}` lacks; using {mode} (fp32)"
        ),
        _ if mode.is_cooperative() => {
            format!("note: matmul precision {mode} (cooperative matrices on `{adapter}`)")
        }
        _ => format!("note: matmul precision {mode} (fp32)"),
    };
    (mode, line)
}

/// Write `line` to stderr the first time this process asks for it. Not `eprintln!`, which
/// panics when stderr cannot be written (`2>/dev/full`).
pub(crate) fn note_once(line: &str) {
    use std::io::Write;
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.iter().any(|s| s == line) {
        seen.push(line.to_string());
        let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
    }
}

/// A wgpu error as one lower-case-led text, with its source chain (where naga's message lives).
fn error_text(e: &wgpu::Error) -> String {
    let mut text = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        src = s.source();
    }
    text.trim_end().trim_end_matches('.').to_string()
}

static TEST_GPU: OnceLock<Result<Gpu>> = OnceLock::new();

/// This process's rank among the ranks of its job on this machine (see [`use_local_rank`]).
static LOCAL_RANK: AtomicUsize = AtomicUsize::new(0);

/// Open devices from now on on the adapter of local rank `rank`: the `rank`-th (wrapping) of the
/// adapters of the best kind, in the order the driver lists them. A data-parallel job calls it
/// before anything opens a device; a process on its own keeps rank 0, the first adapter.
pub fn use_local_rank(rank: usize) {
    LOCAL_RANK.store(rank, Ordering::Relaxed);
}
static TEST_GPU_AT_WEBGPU_LIMITS: OnceLock<Result<Gpu>> = OnceLock::new();

/// The process-wide device for `choice`, opened once: `None` means the CPU backend (`cpu`, or
/// `auto` when the only adapter is a software one, with a one-line notice the first time).
pub fn shared_gpu(choice: DeviceChoice) -> Result<Option<&'static Gpu>> {
    match choice {
        DeviceChoice::Cpu => Ok(None),
        DeviceChoice::Gpu => test_gpu().map(Some),
        DeviceChoice::Auto => match test_gpu() {
            Ok(gpu) if !gpu.is_software() => Ok(Some(gpu)),
            _ => {
                note_once("note: no hardware GPU adapter found; using the CPU backend");
                Ok(None)
            }
        },
    }
}

/// The process-wide device for tests and benchmarks: any adapter (lavapipe counts), opened once.
/// An error when wgpu finds no adapter.
pub fn test_gpu() -> Result<&'static Gpu> {
    let opened = TEST_GPU.get_or_init(|| {
        Gpu::open(DeviceChoice::Gpu)?.ok_or_else(|| err!(Device, "no wgpu adapter found"))
    });
    opened.as_ref().map_err(Error::clone)
}

/// For tests: a second process-wide device on the same adapter, opened with WebGPU's default
/// limits (8 storage buffers per stage, 128 MiB per binding, ...) where the adapter allows
/// more, so every adapter's plans are tested at the limits every adapter meets.
pub fn test_gpu_at_webgpu_limits() -> Result<&'static Gpu> {
    let opened = TEST_GPU_AT_WEBGPU_LIMITS.get_or_init(|| {
        let webgpu = |own: wgpu::Limits| wgpu::Limits::default().or_worse_values_from(&own);
        Gpu::open_with(DeviceChoice::Gpu, webgpu)?
            .ok_or_else(|| err!(Device, "no wgpu adapter found"))
    });
    opened.as_ref().map_err(Error::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_choice_parses_and_lists_choices_on_error() {
        assert_eq!("auto".parse::<DeviceChoice>().unwrap(), DeviceChoice::Auto);
        assert_eq!(" GPU ".parse::<DeviceChoice>().unwrap(), DeviceChoice::Gpu);
        assert_eq!("cpu".parse::<DeviceChoice>().unwrap(), DeviceChoice::Cpu);
        let e = "cuda".parse::<DeviceChoice>().unwrap_err();
        assert_eq!(e.message, "unknown device `cuda` (valid choices: auto, gpu, cpu)");
    }

    #[test]
    fn split_workgroups_stays_within_limit_and_covers_n() {
        for (n, max) in [
            (0, 65535),
            (1, 65535),
            (65535, 65535),
            (65536, 65535),
            (200_000, 65535),
            (u32::MAX, 65535),
            (10, 3),
            (7, 2),
        ] {
            let [x, y, z] = split_workgroups(n, max);
            assert!(x <= max && y <= max && z <= max, "{n}/{max}: {x} {y} {z}");
            let total = u64::from(x) * u64::from(y) * u64::from(z);
            assert!(total >= u64::from(n), "{n}/{max}: {x} {y} {z}");
            assert!(
                total <= u64::from(n) + u64::from(x) * u64::from(y) + u64::from(x),
                "{n}: excess"
            );
        }
        assert_eq!(split_workgroups(70_000, 65535), [35_000, 2, 1]);
    }

    #[test]
    fn precision_notes_say_the_mode_and_why() {
        use MatmulPrecision::*;
        let cases = [
            (None, true, High, "note: matmul precision high (cooperative matrices on `gpu`)"),
            (Some(Medium), true, Medium, "note: matmul precision medium (cooperative matrices on `gpu`)"),
            (None, false, Highest, "note: matmul precision highest (fp32)"),
            (Some(Highest), true, Highest, "note: matmul precision highest (fp32)"),
            (
                Some(High),
                false,
                Highest,
                "note: matmul precision high needs cooperative matrices, which `gpu` lacks; using highest (fp32)",
            ),
        ];
        for (requested, coop, mode, line) in cases {
            assert_eq!(precision_note(requested, coop, "gpu"), (mode, line.to_string()));
        }
    }

    #[test]
    fn cpu_choice_opens_no_device() {
        assert!(Gpu::open(DeviceChoice::Cpu).unwrap().is_none());
    }
}
