//! Embeddings and vector search.
//!
//! An embedding column is `FixedSizeList<Float16 | Float32, d>`, or `FixedSizeList<UInt16, d>`
//! whose element field carries `spate.bfloat16 = true` (Arrow has no bf16 type). [`elem`] names
//! the element types and their conversions, [`distance`] the distance arithmetic every engine
//! shares, and [`functions`] Spate's `cosine_distance`, `inner_product`/`dot_product` and
//! `array_distance`, which replace DataFusion's in every session. [`table_function`] is
//! `vector_topk`, the k nearest items of many queries at once, and [`nearest`] its CPU
//! operator.
//!
//! **The arithmetic.** Over an embedding, a distance is accumulated in fp32, one element after
//! the other in element order, each operation rounded (no fused multiply-add: NVRTC compiles
//! with `--fmad=false`), and finished in f64 (see [`distance::score`]). The GPU kernels
//! (`kernels/cuda/common/vector.cuh`) do the same operations in the same order, so the CPU and
//! GPU results are equal bit for bit. Lists that are not embeddings keep DataFusion's f64
//! functions.

pub(crate) mod distance;
pub(crate) mod elem;
pub(crate) mod functions;
mod lanes;
pub mod nearest;
pub mod table_function;

pub use distance::{Metric, score};
pub use elem::{BFLOAT16_KEY, Elem};
pub use functions::functions;
pub(crate) use functions::{is_spate_distance, register};
pub use nearest::{NearestKey, VectorTopKExec};
pub use table_function::VectorTopKFunction;
