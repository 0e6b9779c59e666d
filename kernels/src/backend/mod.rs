//! The two backends behind [`crate::Device`]: `cuda` (cudarc, driver API, NVRTC) and `emulated`
//! (the kernels compiled as host C++, run by `kernels/emu/spate_emu.h`).

pub(crate) mod cuda;
pub(crate) mod emulated;
