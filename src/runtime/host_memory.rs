//! Host memory the GPU reads and writes in place: a Vulkan device opened with
//! `VK_EXT_external_memory_host` (wgpu-hal 30 does not enable it itself), and host memory
//! imported into it as a `wgpu::Buffer` that copies go to and come from. Data-parallel training
//! imports the memory every rank of a machine maps ([`crate::dist::NodeRegion`]), so the GPUs'
//! copy engines move gradients between ranks and the host only synchronizes
//! (`runtime/exchange.rs`).
//!
//! Linux only (the Vulkan backend and `ash`, the crate wgpu-hal is written on); elsewhere
//! [`open`] opens nothing and data-parallel steps stage through host vectors.

#[cfg(target_os = "linux")]
mod vulkan {
    use crate::err;
    use crate::error::Result;
    use ash::vk;
    use std::ffi::c_void;
    use wgpu::hal::api::Vulkan;

    const HOST: vk::ExternalMemoryHandleTypeFlags =
        vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;

    /// Open a device on `adapter` as `desc` asks, with `VK_EXT_external_memory_host` enabled:
    /// the device, its queue and the alignment an imported pointer and size need
    /// (`minImportedHostPointerAlignment`). `None` when the adapter is not Vulkan, does not
    /// advertise the extension, or the device cannot be opened this way (the caller then opens
    /// it as usual).
    pub fn open(
        adapter: &wgpu::Adapter,
        desc: &wgpu::DeviceDescriptor<'_>,
    ) -> Option<(wgpu::Device, wgpu::Queue, u64)> {
        if adapter.get_info().backend != wgpu::Backend::Vulkan {
            return None;
        }
        // `create_device_from_hal` skips the checks `request_device` makes: ask only for what
        // the adapter has, and leave anything else to `request_device` and its error.
        if !desc.required_limits.check_limits(&adapter.limits())
            || !adapter.features().contains(desc.required_features)
        {
            return None;
        }
        let name = ash::ext::external_memory_host::NAME;
        // SAFETY: the hal adapter is only read here and dropped before the device is created.
        let open = unsafe {
            let hal = adapter.as_hal::<Vulkan>()?;
            let caps = hal.physical_device_capabilities();
            if !caps.supports_extension(name) || caps.properties().api_version < vk::API_VERSION_1_1 {
                return None;
            }
            let mut host = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
            let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut host);
            let instance = hal.shared_instance().raw_instance();
            instance.get_physical_device_properties2(hal.raw_physical_device(), &mut props);
            let align = host.min_imported_host_pointer_alignment;
            let push: Box<wgpu::hal::vulkan::CreateDeviceCallback<'_>> =
                Box::new(move |args| args.extensions.push(name));
            let device = hal
                .open_with_callback(
                    desc.required_features,
                    &desc.required_limits,
                    &desc.memory_hints,
                    Some(push),
                )
                .ok()?;
            (device, align)
        };
        let (device, align) = open;
        // SAFETY: `device` was opened on this adapter with the features and limits of `desc`.
        let (device, queue) = unsafe { adapter.create_device_from_hal(device, desc) }.ok()?;
        Some((device, queue, align.max(1)))
    }

    /// Import `len` bytes at `ptr` into `device` (opened by [`open`]) as a buffer that copies
    /// read and write (`COPY_SRC | COPY_DST`).
    ///
    /// # Safety
    /// `ptr` and `len` are multiples of the device's import alignment, and the memory stays
    /// valid and mapped until the buffer is destroyed and the device has finished every
    /// submission that used it.
    pub unsafe fn import(
        device: &wgpu::Device,
        ptr: *mut u8,
        len: u64,
        label: &str,
    ) -> Result<wgpu::Buffer> {
        let fail = |what: &str, e: vk::Result| err!(Device, "cannot import host memory ({what}: {e})");
        let hal_buffer = {
            let hal = unsafe { device.as_hal::<Vulkan>() }
                .ok_or_else(|| err!(Device, "cannot import host memory: not a Vulkan device"))?;
            let raw = hal.raw_device();
            let instance = hal.shared_instance().raw_instance();
            let ext = ash::ext::external_memory_host::Device::new(instance, raw);
            let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(HOST);
            let info = vk::BufferCreateInfo::default()
                .size(len)
                .usage(vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST)
                .sharing_mode(vk::SharingMode::EXCLUSIVE)
                .push_next(&mut external);
            let buffer = unsafe { raw.create_buffer(&info, None) }.map_err(|e| fail("buffer", e))?;
            let free_buffer = |e| {
                unsafe { raw.destroy_buffer(buffer, None) };
                e
            };
            let needs = unsafe { raw.get_buffer_memory_requirements(buffer) };
            let mut host = vk::MemoryHostPointerPropertiesEXT::default();
            let got = unsafe {
                (ext.fp().get_memory_host_pointer_properties_ext)(
                    raw.handle(),
                    HOST,
                    ptr as *const c_void,
                    &mut host,
                )
            };
            if got != vk::Result::SUCCESS {
                return Err(free_buffer(fail("host pointer properties", got)));
            }
            let types = needs.memory_type_bits & host.memory_type_bits;
            if types == 0 || needs.size > len {
                return Err(free_buffer(err!(
                    Device,
                    "cannot import host memory: no memory type fits ({} bytes needed, {len} given)",
                    needs.size
                )));
            }
            let mut import =
                vk::ImportMemoryHostPointerInfoEXT::default().handle_type(HOST).host_pointer(ptr.cast());
            let alloc = vk::MemoryAllocateInfo::default()
                .allocation_size(len)
                .memory_type_index(types.trailing_zeros())
                .push_next(&mut import);
            let memory = unsafe { raw.allocate_memory(&alloc, None) }
                .map_err(|e| free_buffer(fail("allocation", e)))?;
            if let Err(e) = unsafe { raw.bind_buffer_memory(buffer, memory, 0) } {
                unsafe { raw.free_memory(memory, None) };
                return Err(free_buffer(fail("binding", e)));
            }
            // wgpu destroys the buffer and frees the imported memory object when it is dropped
            // (the host memory itself stays the caller's).
            unsafe { wgpu::hal::vulkan::Buffer::from_raw_managed(buffer, memory, 0, len) }
        };
        let desc = wgpu::BufferDescriptor {
            label: Some(label),
            size: len,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        };
        Ok(unsafe { device.create_buffer_from_hal::<Vulkan>(hal_buffer, &desc) })
    }
}

#[cfg(target_os = "linux")]
pub use vulkan::{import, open};

/// Without the Vulkan backend no device imports host memory.
#[cfg(not(target_os = "linux"))]
pub fn open(
    _: &wgpu::Adapter,
    _: &wgpu::DeviceDescriptor<'_>,
) -> Option<(wgpu::Device, wgpu::Queue, u64)> {
    None
}

/// Never called: [`open`] opens no device that imports.
///
/// # Safety
/// As on Linux.
#[cfg(not(target_os = "linux"))]
pub unsafe fn import(_: &wgpu::Device, _: *mut u8, _: u64, _: &str) -> crate::error::Result<wgpu::Buffer> {
    Err(crate::err!(Device, "this platform cannot import host memory into the gpu"))
}
