//! Engine settings that are Spate's own: the execution backend, the `spate.*` session options
//! (GPU fallback policy, upload batch size) and size parsing.

use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{ConfigExtension, ConfigField, Visit};
use datafusion::common::{config_namespace, extensions_options};
use datafusion::error::DataFusionError;

use crate::error::SpateError;

/// Where query operators run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// Use a CUDA GPU when one is present and usable, the CPU otherwise.
    #[default]
    Auto,
    /// Real NVIDIA GPUs through the CUDA driver and NVRTC.
    Cuda,
    /// The GPU kernels compiled for the host and run by the emulator (for testing, not speed).
    Emulated,
    /// DataFusion's CPU operators only.
    Cpu,
}

impl Backend {
    /// All backends, in the order the CLI lists them.
    pub const ALL: [Backend; 4] = [
        Backend::Auto,
        Backend::Cuda,
        Backend::Emulated,
        Backend::Cpu,
    ];

    /// The name used on the command line and in settings.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Cuda => "cuda",
            Backend::Emulated => "emulated",
            Backend::Cpu => "cpu",
        }
    }
}

/// Which devices a session runs on: `--devices 4`, `--devices cuda:0,1,3`.
///
/// A count on the emulator opens that many emulated devices, each with its own memory budget,
/// streams and memory. On `cuda` it takes the first devices; past the devices the machine has
/// it opens logical devices on them in turn (two on one GPU share it, each with its own pool),
/// so the multi-device code paths run on a machine with one GPU too. A list names the CUDA
/// ordinals; on the emulator it only names the devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    /// This many devices.
    Count(usize),
    /// These ordinals, in this order.
    Ordinals(Vec<usize>),
}

impl Default for Devices {
    fn default() -> Self {
        Devices::Count(1)
    }
}

impl Devices {
    /// How many devices.
    pub fn len(&self) -> usize {
        match self {
            Devices::Count(n) => *n,
            Devices::Ordinals(o) => o.len(),
        }
    }

    /// Always false: a spec names at least one device (parsing refuses none).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ordinal of each device, given how many the machine has (`available`, at least one):
    /// a count past them wraps round, one logical device more on each in turn.
    pub fn ordinals(&self, available: usize) -> Vec<usize> {
        match self {
            Devices::Count(n) => (0..*n).map(|i| i % available.max(1)).collect(),
            Devices::Ordinals(o) => o.clone(),
        }
    }
}

impl fmt::Display for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Devices::Count(n) => write!(f, "{n}"),
            Devices::Ordinals(o) => {
                let list: Vec<String> = o.iter().map(usize::to_string).collect();
                write!(f, "cuda:{}", list.join(","))
            }
        }
    }
}

/// The most devices a session may use: an exchange splits rows into 16 hash groups.
pub const MAX_DEVICES: usize = 16;

impl FromStr for Devices {
    type Err = SpateError;

    /// `4` (a count), or `cuda:0,1,3` / `0,1,3` (ordinals; `cuda:2` is the one device 2).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| SpateError::Config {
            message: format!(
                "devices '{s}': {why}; expected a count such as 4 or a list such as cuda:0,1,3"
            ),
        };
        let text = s.trim();
        let (list, named) = match text.strip_prefix("cuda:") {
            Some(rest) => (rest, true),
            None => (text, text.contains(',')),
        };
        let numbers = list
            .split(',')
            .map(|n| n.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad("not a number"))?;
        let devices = if named {
            let mut seen = numbers.clone();
            seen.sort_unstable();
            seen.dedup();
            if seen.len() != numbers.len() {
                return Err(bad("a device is listed twice"));
            }
            Devices::Ordinals(numbers)
        } else {
            Devices::Count(numbers[0])
        };
        match devices.len() {
            0 => Err(bad("at least one device is needed")),
            n if n > MAX_DEVICES => Err(bad(&format!("at most {MAX_DEVICES} devices"))),
            _ => Ok(devices),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Backend {
    type Err = SpateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Backend::ALL
            .into_iter()
            .find(|b| b.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| SpateError::Config {
                message: format!(
                    "unknown backend '{s}': expected one of auto, cuda, emulated, cpu"
                ),
            })
    }
}

/// Parses a byte size such as `4G`, `512MiB`, `1.5GB` or `1048576`.
///
/// Suffixes are binary multiples (K = 1024) whether or not they carry an `i`, as memory limits
/// conventionally are.
pub fn parse_byte_size(text: &str) -> Result<usize, SpateError> {
    let invalid = || SpateError::Config {
        message: format!(
            "invalid size '{text}': expected a number of bytes with an optional K, M, G or T \
             suffix, e.g. 512M or 4G"
        ),
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    let number: f64 = number.parse().map_err(|_| invalid())?;
    let multiplier: f64 = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "K" | "KB" | "KIB" => 1024.0,
        "M" | "MB" | "MIB" => 1024.0 * 1024.0,
        "G" | "GB" | "GIB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "TB" | "TIB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(invalid()),
    };
    let bytes = number * multiplier;
    if !bytes.is_finite() || bytes < 1.0 || bytes > usize::MAX as f64 {
        return Err(invalid());
    }
    Ok(bytes as usize)
}

/// What a GPU backend does with an expression, type or operator it cannot run
/// (`SET spate.gpu.fallback = 'cpu' | 'warn' | 'error'`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FallbackPolicy {
    /// Run it on the CPU quietly.
    #[default]
    Cpu,
    /// Run it on the CPU and log the reason as a warning.
    Warn,
    /// Fail the query, naming what is unsupported.
    Error,
}

impl fmt::Display for FallbackPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FallbackPolicy::Cpu => "cpu",
            FallbackPolicy::Warn => "warn",
            FallbackPolicy::Error => "error",
        })
    }
}

impl FromStr for FallbackPolicy {
    type Err = SpateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(FallbackPolicy::Cpu),
            "warn" => Ok(FallbackPolicy::Warn),
            "error" => Ok(FallbackPolicy::Error),
            _ => Err(SpateError::Config {
                message: format!("unknown fallback policy '{s}': expected one of cpu, warn, error"),
            }),
        }
    }
}

/// `ConfigField` for settings that parse with `FromStr` into a [`SpateError`]: DataFusion's
/// `SET` stores them parsed and reports a bad value as a configuration error.
macro_rules! parsed_config_field {
    ($($t:ty),*) => { $(
        impl ConfigField for $t {
            fn visit<V: Visit>(&self, v: &mut V, key: &str, description: &'static str) {
                v.some(key, self, description)
            }

            fn set(&mut self, _key: &str, value: &str) -> datafusion::error::Result<()> {
                *self = value
                    .parse()
                    .map_err(|e: SpateError| DataFusionError::Configuration(e.to_string()))?;
                Ok(())
            }
        }
    )* };
}

parsed_config_field!(FallbackPolicy, DeviceErrorPolicy, ByteSize);

/// What a GPU session does once its device has failed with a sticky fault
/// (`SET spate.gpu.on_device_error = 'cpu' | 'error'`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceErrorPolicy {
    /// Plan later queries on the CPU.
    #[default]
    Cpu,
    /// Refuse later queries, saying why.
    Error,
}

impl fmt::Display for DeviceErrorPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceErrorPolicy::Cpu => "cpu",
            DeviceErrorPolicy::Error => "error",
        })
    }
}

impl FromStr for DeviceErrorPolicy {
    type Err = SpateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceErrorPolicy::Cpu),
            "error" => Ok(DeviceErrorPolicy::Error),
            _ => Err(SpateError::Config {
                message: format!("unknown device error policy '{s}': expected cpu or error"),
            }),
        }
    }
}

config_namespace! {
    /// GPU settings (`spate.gpu.*`).
    pub struct GpuOptions {
        /// What to do with an unsupported expression, type or operator: cpu, warn or error.
        pub fallback: FallbackPolicy, default = FallbackPolicy::Cpu
        /// Host batches are coalesced to about this many bytes before they are uploaded.
        pub batch_bytes: usize, default = 128 * 1024 * 1024
        /// Run every GPU region as one partition per device, its exchanges removed (true), or
        /// keep the partitions DataFusion planned for the CPU (false).
        pub one_partition: bool, default = true
        /// Device memory one query may use, e.g. 512M; 0 (the default) means the device
        /// pool's whole budget (`--gpu-memory-limit`). Operators size themselves to it and
        /// spill to the host beyond it; each GPU region's allocations are charged to it.
        pub memory_limit: ByteSize, default = ByteSize(0)
        /// Once the device has failed with a sticky fault: plan later queries on the CPU
        /// (cpu), or refuse them (error).
        pub on_device_error: DeviceErrorPolicy, default = DeviceErrorPolicy::Cpu
        /// With several devices, the one every GPU operator of a query runs on (its index
        /// among the session's devices). Unset, a plan spread over the devices
        /// (`one_partition`) runs partition `p` on device `p % devices`, and any other plan on
        /// the first device. A Ballista executor sets it per task.
        pub device: Option<usize>, default = None
    }
}

extensions_options! {
    /// Spate's own session settings, set with `SET spate.<name> = <value>`.
    pub struct SpateOptions {
        /// GPU settings.
        pub gpu: GpuOptions, default = GpuOptions::default()
    }
}

impl ConfigExtension for SpateOptions {
    const PREFIX: &'static str = "spate";
}

/// A byte size as a session option: `SET spate.gpu.memory_limit = '512M'` (or a plain number
/// of bytes; see [`parse_byte_size`]). 0 means unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByteSize(pub usize);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for ByteSize {
    type Err = SpateError;

    /// A size as [`parse_byte_size`] reads it, or `0` for unset.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "0" => Ok(ByteSize(0)),
            size => parse_byte_size(size).map(ByteSize),
        }
    }
}

impl SpateOptions {
    /// The index among the session's `devices` of the device a GPU subtree's `partition` runs
    /// on (see `spate.gpu.device`): the pinned device, else partition `p` on device
    /// `p % devices` where the subtree was spread over the devices (`spread`: placed by
    /// `plan/devices.rs`), else the first.
    pub fn device_for(
        options: &datafusion::common::config::ConfigOptions,
        partition: usize,
        devices: usize,
        spread: bool,
    ) -> usize {
        let pinned = options
            .extensions
            .get::<SpateOptions>()
            .and_then(|o| o.gpu.device);
        match pinned {
            Some(d) => d % devices.max(1),
            None if spread => partition % devices.max(1),
            None => 0,
        }
    }

    /// `spate.gpu.memory_limit` of a session's options, when set.
    pub fn gpu_memory_limit(options: &datafusion::common::config::ConfigOptions) -> Option<usize> {
        options
            .extensions
            .get::<SpateOptions>()
            .map(|o| o.gpu.memory_limit.0)
            .filter(|&b| b > 0)
    }

    /// `spate.gpu.batch_bytes` of a session's options (the default where Spate's options are
    /// not registered), at least 1.
    pub fn gpu_batch_bytes(options: &datafusion::common::config::ConfigOptions) -> usize {
        options
            .extensions
            .get::<SpateOptions>()
            .map_or_else(
                || SpateOptions::default().gpu.batch_bytes,
                |o| o.gpu.batch_bytes,
            )
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_case_insensitively() {
        for b in Backend::ALL {
            assert_eq!(b.as_str().to_uppercase().parse::<Backend>().unwrap(), b);
        }
        let err = "gpu".parse::<Backend>().unwrap_err().to_string();
        assert!(err.contains("unknown backend 'gpu'"), "{err}");
    }

    #[test]
    fn devices_are_a_count_or_a_list_of_ordinals() {
        assert_eq!("4".parse::<Devices>().unwrap(), Devices::Count(4));
        assert_eq!(
            "cuda:0,1,3".parse::<Devices>().unwrap(),
            Devices::Ordinals(vec![0, 1, 3])
        );
        assert_eq!(
            "2,5".parse::<Devices>().unwrap(),
            Devices::Ordinals(vec![2, 5])
        );
        assert_eq!(
            "cuda:2".parse::<Devices>().unwrap(),
            Devices::Ordinals(vec![2])
        );
        assert_eq!(Devices::Count(3).ordinals(1), vec![0, 0, 0]);
        assert_eq!(Devices::Count(3).ordinals(2), vec![0, 1, 0]);
        assert_eq!(
            "cuda:0,1,3".parse::<Devices>().unwrap().to_string(),
            "cuda:0,1,3"
        );
        for bad in ["0", "x", "cuda:1,1", "17", ""] {
            let err = bad.parse::<Devices>().unwrap_err().to_string();
            assert!(err.contains("expected a count"), "{bad}: {err}");
        }
    }

    #[test]
    fn spate_options_set_through_datafusion_config() {
        let mut options = datafusion::common::config::ConfigOptions::default();
        options.extensions.insert(SpateOptions::default());
        options.set("spate.gpu.fallback", "WARN").unwrap();
        options.set("spate.gpu.batch_bytes", "1048576").unwrap();
        options.set("spate.gpu.memory_limit", "16M").unwrap();
        assert_eq!(SpateOptions::gpu_memory_limit(&options), Some(16 << 20));
        assert!(options.set("spate.gpu.memory_limit", "lots").is_err());
        let spate = options.extensions.get::<SpateOptions>().unwrap();
        assert_eq!(spate.gpu.fallback, FallbackPolicy::Warn);
        assert_eq!(spate.gpu.batch_bytes, 1 << 20);
        let err = options.set("spate.gpu.fallback", "gpu").unwrap_err();
        assert!(
            err.to_string().contains("expected one of cpu, warn, error"),
            "{err}"
        );
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("1024").unwrap(), 1024);
        assert_eq!(parse_byte_size("4K").unwrap(), 4096);
        assert_eq!(parse_byte_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_byte_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_byte_size(" 2 GB ").unwrap(), 2 << 30);
        for bad in ["", "G", "-1", "0", "12Q", "1..2M", "1e99T"] {
            assert!(parse_byte_size(bad).is_err(), "{bad} should be rejected");
        }
    }
}
