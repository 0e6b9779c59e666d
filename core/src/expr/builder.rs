//! The one kernel builder: lowers a kernel's expressions ([`super::lower`]), prints them into a
//! row loop ([`super::emit`]) and wraps the loop in an entry point whose parameters follow
//! [`super::abi`]. A predicate and a list of values differ only in what the loop stores.

use std::fmt::Write as _;
use std::sync::Arc;

use arrow::datatypes::{DataType, Schema};
use datafusion::physical_expr::PhysicalExpr;

use super::abi::{KernelInput, column_params, scalar_params, vector_params};
use super::emit::{Emitter, Operand};
use super::ir::{Node, Op};
use super::lower::Lowerer;
use super::scalars::RuntimeScalar;
use super::types::DevType;
use super::{Unsupported, blake3_hex};

/// The headers every generated expression kernel includes.
const INCLUDES: &str = "#include \"common/prelude.cuh\"\n#include \"common/bitmap.cuh\"\n\
#include \"common/order.cuh\"\n#include \"common/strings.cuh\"\n#include \"common/dates.cuh\"\n\
#include \"common/checked.cuh\"\n#include \"common/arith.cuh\"\n#include \"common/casts.cuh\"\n\
#include \"common/logic.cuh\"\n#include \"common/math.cuh\"\n";

/// A compiled-to-source predicate: its CUDA source, entry point and the columns it reads.
#[derive(Debug, Clone)]
pub struct PredicateKernel {
    /// Full source, ready for `Device::compile_generated`.
    pub source: String,
    /// The entry point, unique per source (`spate_pred_<hash>`).
    pub entry: String,
    /// The columns, in the kernel's parameter order ([`super::abi`]).
    pub inputs: Vec<KernelInput>,
    /// Values read at launch (scalar subquery results), in parameter order.
    pub scalars: Vec<RuntimeScalar>,
    /// Constant vectors the kernel reads from device memory (a distance's query), in
    /// parameter order: each is copied to the device at every launch.
    pub vectors: Vec<Arc<[f32]>>,
    /// What can fail (overflow, division by zero, a cast): an error-word bit and the message
    /// the query fails with when the kernel sets it in `*err`.
    pub checks: Vec<(u32, String)>,
}

/// A compiled-to-source list of value expressions (a projection): one kernel computes every
/// output column, with its validity.
#[derive(Debug, Clone)]
pub struct ValueKernel {
    /// Full source, ready for `Device::compile_generated`.
    pub source: String,
    /// The entry point (`spate_proj_<hash>`).
    pub entry: String,
    /// The columns read, then the runtime scalars, laid out as [`super::abi`] says, followed by
    /// `const u32* live` (the batch's device row count, or null: rows at or past it are not
    /// computed, and their values, validity words and string lengths are not written), `u64 n`,
    /// `const u32* rows` (output `o` reads input row `rows[o]`, or row `o` when null: a filter's
    /// kept rows, so the gather is fused into the kernel), `u32 pass` and then, per output,
    /// `(T* values, u32* validity_words)`, or for a string output
    /// `(u64* offsets, u8* bytes, u32* validity_words)`, then `u32* err` when `checks` is not
    /// empty. Every output gets a validity bitmap, and its nulls are not counted: the count
    /// stays on the device until a host consumer asks for it
    /// ([`crate::column::DeviceColumn::count_nulls`]). Without string outputs the kernel runs once
    /// (`pass` 0). With them it runs twice: pass 0 computes every output and writes each
    /// string's length to `offsets`, which the host turns into offsets by an exclusive scan;
    /// pass 1 copies each string's bytes there.
    pub inputs: Vec<KernelInput>,
    /// As [`PredicateKernel::scalars`].
    pub scalars: Vec<RuntimeScalar>,
    /// As [`PredicateKernel::vectors`].
    pub vectors: Vec<Arc<[f32]>>,
    /// As [`PredicateKernel::checks`].
    pub checks: Vec<(u32, String)>,
    /// The Arrow type of each output.
    pub outputs: Vec<DataType>,
}

/// What a kernel stores per row.
enum Store {
    /// A byte: 1 where the one expression is TRUE.
    Predicate,
    /// Each expression's value and validity, of these Arrow types.
    Values(Vec<DataType>),
}

/// A generated kernel, before it is named as a predicate or values.
struct Generated {
    source: String,
    entry: String,
    inputs: Vec<KernelInput>,
    scalars: Vec<RuntimeScalar>,
    vectors: Vec<Arc<[f32]>>,
    checks: Vec<(u32, String)>,
}

/// Generates the predicate kernel for `predicate` over rows of `input_schema`.
pub fn predicate_kernel(
    predicate: &dyn PhysicalExpr,
    input_schema: &Schema,
) -> Result<PredicateKernel, Unsupported> {
    let g = build(&[predicate], input_schema, Store::Predicate)?;
    Ok(PredicateKernel {
        source: g.source,
        entry: g.entry,
        inputs: g.inputs,
        scalars: g.scalars,
        vectors: g.vectors,
        checks: g.checks,
    })
}

/// Generates one kernel computing `exprs` over rows of `input_schema`.
pub fn value_kernel(
    exprs: &[&dyn PhysicalExpr],
    input_schema: &Schema,
) -> Result<ValueKernel, Unsupported> {
    let outputs = exprs
        .iter()
        .map(|e| {
            e.data_type(input_schema)
                .map_err(|err| Unsupported(format!("`{e}`: {err}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let g = build(exprs, input_schema, Store::Values(outputs.clone()))?;
    Ok(ValueKernel {
        source: g.source,
        entry: g.entry,
        inputs: g.inputs,
        scalars: g.scalars,
        vectors: g.vectors,
        checks: g.checks,
        outputs,
    })
}

fn build(
    exprs: &[&dyn PhysicalExpr],
    schema: &Schema,
    store: Store,
) -> Result<Generated, Unsupported> {
    let mut lowerer = Lowerer::new(schema);
    let mut nodes = Vec::with_capacity(exprs.len());
    for (j, expr) in exprs.iter().enumerate() {
        let want = match &store {
            Store::Predicate => DevType::Bool,
            Store::Values(outputs) => {
                let data_type = &outputs[j];
                DevType::of(data_type).ok_or_else(|| {
                    Unsupported(format!(
                        "`{expr}` yields {data_type}, which GPU expressions do not compute yet"
                    ))
                })?
            }
        };
        let node = lowerer.lower(*expr)?;
        if node.ty != want {
            return Err(Unsupported(match &store {
                Store::Predicate => format!("predicate `{expr}` is not boolean"),
                Store::Values(outputs) => format!(
                    "`{expr}` computes {:?} on the GPU but DataFusion types it {}",
                    node.ty, outputs[j]
                ),
            }));
        }
        if contains_concat(&node) {
            return Err(Unsupported(format!(
                "`{expr}`: a `||` inside another expression is not supported on the GPU yet"
            )));
        }
        if misplaced_stream(&node) {
            return Err(Unsupported(format!(
                "`{expr}`: `upper` or `replace` feeding anything but a comparison or the output \
                 is not supported on the GPU yet"
            )));
        }
        nodes.push(node);
    }
    let mut emitter = Emitter::default();
    let roots: Vec<Operand> = nodes.iter().map(|n| emitter.node(n)).collect();
    let stores: Vec<(String, String)> = roots
        .iter()
        .map(|r| (emitter.stored_len(r), emitter.store_bytes(r)))
        .collect();
    let mut params = column_params("", lowerer.inputs.len());
    params.push_str(&scalar_params(lowerer.scalars.len()));
    params.push_str(&vector_params(lowerer.vectors.len()));
    let err = if emitter.checks.is_empty() {
        ""
    } else {
        ", u32* err"
    };
    let (kind, body) = match &store {
        Store::Predicate => (
            "pred",
            predicate_loop(&params, err, &emitter.body, &roots[0]),
        ),
        Store::Values(outputs) => (
            "proj",
            values_loop(&params, err, &emitter.body, &roots, &stores, outputs),
        ),
    };
    let entry = format!("spate_{kind}_{}", blake3_hex(&body));
    let names: Vec<String> = exprs.iter().map(|e| e.to_string()).collect();
    let source = format!(
        "// Generated by spate::expr from [{}].\n{INCLUDES}{}\n{}",
        names.join(", ").replace('\n', " "),
        [
            (emitter.uses_streams(), "#include \"common/upper.cuh\"\n"),
            (emitter.uses_vectors(), "#include \"common/vector.cuh\"\n"),
        ]
        .iter()
        .filter(|(used, _)| *used)
        .map(|(_, include)| *include)
        .collect::<String>(),
        body.replace("ENTRY", &entry)
    );
    Ok(Generated {
        source,
        entry,
        inputs: lowerer.inputs,
        scalars: lowerer.scalars,
        vectors: lowerer.vectors,
        checks: emitter.checks,
    })
}

/// Whether a concatenation sits below `node`: its bytes would have to be somewhere before
/// they are stored.
fn contains_concat(node: &Node) -> bool {
    node.children()
        .into_iter()
        .any(|c| matches!(c.op, Op::Concat(_)) || contains_concat(c))
}

/// Whether a streamed string (`upper`, `replace`) sits where its bytes would have to be
/// stored: anywhere but under a comparison or at the root (a value kernel's output), or over a
/// `||` or another streamed string.
fn misplaced_stream(node: &Node) -> bool {
    fn streamed(n: &Node) -> Option<&Node> {
        match &n.op {
            Op::Upper(arg) | Op::Replace { arg, .. } => Some(arg),
            _ => None,
        }
    }
    let nested = |arg: &Node| streamed(arg).is_some() || matches!(arg.op, Op::Concat(_));
    let compares = matches!(node.op, Op::Compare { .. } | Op::Distinct { .. });
    node.children().into_iter().any(|c| {
        let placed = match streamed(c) {
            Some(arg) => compares && !nested(arg),
            None => true,
        };
        !placed || misplaced_stream(c)
    }) || streamed(node).is_some_and(nested)
}

/// A predicate's kernel: a byte per row, 1 where the predicate is TRUE (SQL's `WHERE` keeps
/// only TRUE), 0 past the live rows.
fn predicate_loop(params: &str, err: &str, rows: &str, root: &Operand) -> String {
    format!(
        "extern \"C\" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY({params}const u32* live, u64 n, u8* out{err}) {{\n    const u64 m = spate::live_rows(live, n);\n    for (u64 i = spate::global_thread_index(); i < n; i += spate::grid_stride()) {{\n        if (i >= m) {{ out[i] = 0; continue; }}\n{rows}        out[i] = (!{} && {}) ? 1 : 0;\n    }}\n}}\nSPATE_EXPORT(ENTRY)\n",
        root.null, root.value
    )
}

/// A value kernel: each output's value and validity, as [`ValueKernel`] lays them out.
fn values_loop(
    params: &str,
    err: &str,
    rows: &str,
    roots: &[Operand],
    stores: &[(String, String)],
    outputs: &[DataType],
) -> String {
    let mut params = format!("{params}const u32* live, u64 n, const u32* rows, u32 pass");
    let mut declare = String::new();
    let mut store = String::new();
    let mut publish = String::new();
    for (j, f) in roots.iter().enumerate() {
        let dev = DevType::of(&outputs[j]).unwrap_or(DevType::Bool);
        if dev == DevType::Str {
            // Pass 0 writes each string's length into `offs`, which the host turns into
            // offsets by an exclusive scan; pass 1 copies the bytes to them.
            let _ = write!(params, ", u64* offs{j}, u8* bytes{j}, u32* valid{j}");
            let _ = writeln!(declare, "        bool ok{j} = false;");
            let (len, copy) = &stores[j];
            let _ = writeln!(
                store,
                "            ok{j} = !{null};\n            if (pass == 0u) {{ offs{j}[o] = ok{j} ? {len} : 0ull; }} else if (ok{j}) {{ u8* dst = bytes{j} + offs{j}[o]; {copy}}}",
                null = f.null,
            );
            let _ = writeln!(
                publish,
                "        if (pass == 0u) {{ const u32 v = __ballot_sync(SPATE_FULL_MASK, ok{j}); if (spate::lane_id() == 0) {{ valid{j}[base / 32] = v; }} }}"
            );
        } else if dev == DevType::Bool {
            let _ = write!(params, ", u32* out{j}, u32* valid{j}");
            let _ = writeln!(
                declare,
                "        bool set{j} = false;\n        bool ok{j} = false;"
            );
            let _ = writeln!(
                store,
                "            ok{j} = !{};\n            set{j} = ok{j} && {};",
                f.null, f.value
            );
            let _ = writeln!(
                publish,
                "        if (pass == 0u) {{ const u32 w = __ballot_sync(SPATE_FULL_MASK, set{j}); const u32 v = __ballot_sync(SPATE_FULL_MASK, ok{j}); if (spate::lane_id() == 0) {{ out{j}[base / 32] = w; valid{j}[base / 32] = v; }} }}"
            );
        } else {
            let c = dev.c_type();
            let _ = write!(params, ", {c}* out{j}, u32* valid{j}");
            let _ = writeln!(declare, "        bool ok{j} = false;");
            let _ = writeln!(
                store,
                "            ok{j} = !{};\n            if (pass == 0u) out{j}[o] = ok{j} ? ({c}){} : ({c})0;",
                f.null, f.value
            );
            let _ = writeln!(
                publish,
                "        if (pass == 0u) {{ const u32 v = __ballot_sync(SPATE_FULL_MASK, ok{j}); if (spate::lane_id() == 0) {{ valid{j}[base / 32] = v; }} }}"
            );
        }
    }
    let rows: String = rows.lines().map(|l| format!("    {l}\n")).collect();
    // Warp-strided rows: a warp owns 32 consecutive rows per step, so every ballot sees all 32
    // lanes and one lane writes each 32-bit validity word.
    format!(
        "extern \"C\" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) ENTRY({params}{err}) {{\n    const u64 m = spate::live_rows(live, n);\n    const u64 warps = spate::grid_stride() / 32;\n    for (u64 base = (spate::global_thread_index() / 32) * 32; base < m; base += warps * 32) {{\n        const u64 o = base + spate::lane_id();\n{declare}        if (o < m) {{\n            const u64 i = rows != nullptr ? (u64)rows[o] : o;\n{rows}{store}        }}\n{publish}    }}\n}}\nSPATE_EXPORT(ENTRY)\n"
    )
}
