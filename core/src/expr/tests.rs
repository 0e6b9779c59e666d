//! The predicate JIT against DataFusion's own evaluation of the same expression, on the
//! emulated backend, over random data with nulls, NaN, ±0.0 and extremes.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array,
    Int64Array, UInt8Array,
};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CaseExpr, CastExpr, Column, IsNotNullExpr, IsNullExpr, Literal, NegativeExpr,
    NotExpr, in_list,
};
use spate_kernels::reference::Rng;
use spate_kernels::{Device, DeviceOptions};

use super::*;
use crate::column::upload_batch;

fn batch(n: usize, seed: u64) -> RecordBatch {
    let mut r = Rng::new(seed);
    let null = |r: &mut Rng| r.chance(0.15);
    let i32s: Vec<Option<i32>> = (0..n)
        .map(|_| (!null(&mut r)).then(|| r.below(21) as i32 - 10))
        .collect();
    let i64s: Vec<Option<i64>> = (0..n)
        .map(|k| {
            (!null(&mut r)).then(|| match k % 9 {
                0 => i64::MAX,
                1 => i64::MIN,
                _ => r.below(1000) as i64 - 500,
            })
        })
        .collect();
    let f64s: Vec<Option<f64>> = (0..n)
        .map(|k| {
            (!null(&mut r)).then(|| match k % 11 {
                0 => f64::NAN,
                1 => -0.0,
                2 => 0.0,
                3 => f64::INFINITY,
                _ => (r.below(200) as f64 - 100.0) / 8.0,
            })
        })
        .collect();
    let bools: Vec<Option<bool>> = (0..n)
        .map(|_| (!null(&mut r)).then(|| r.chance(0.5)))
        .collect();
    let dates: Vec<Option<i32>> = (0..n)
        .map(|_| (!null(&mut r)).then(|| 10_000 + r.below(30) as i32))
        .collect();
    let decs: Vec<Option<i128>> = (0..n)
        .map(|_| (!null(&mut r)).then(|| r.below(20) as i128 - 3))
        .collect();
    let u8s: Vec<Option<u8>> = (0..n)
        .map(|_| (!null(&mut r)).then(|| r.below(256) as u8))
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from(i32s)),
        Arc::new(Int64Array::from(i64s)),
        Arc::new(Float64Array::from(f64s)),
        Arc::new(BooleanArray::from(bools)),
        Arc::new(Date32Array::from(dates)),
        Arc::new(
            Decimal128Array::from(decs)
                .with_precision_and_scale(15, 2)
                .unwrap(),
        ),
        Arc::new(UInt8Array::from(u8s)),
    ];
    let schema = Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Int64, true),
        Field::new("f", DataType::Float64, true),
        Field::new("p", DataType::Boolean, true),
        Field::new("d", DataType::Date32, true),
        Field::new("m", DataType::Decimal128(15, 2), true),
        Field::new("u", DataType::UInt8, true),
    ]);
    RecordBatch::try_new(Arc::new(schema), columns).unwrap()
}

type E = Arc<dyn PhysicalExpr>;

/// The value kernel's one entry point, compiled for `device`.
fn compile(device: &Device, vk: &ValueKernel) -> spate_kernels::Kernel {
    device
        .compile_generated(&vk.entry, &vk.source, &[&vk.entry])
        .unwrap()
        .remove(0)
}

fn col(schema: &Schema, name: &str) -> E {
    Arc::new(Column::new_with_schema(name, schema).unwrap())
}

fn lit(v: ScalarValue) -> E {
    Arc::new(Literal::new(v))
}

fn bin(l: E, op: Operator, r: E) -> E {
    Arc::new(BinaryExpr::new(l, op, r))
}

fn predicates(s: &Schema) -> Vec<E> {
    let a = || col(s, "a");
    let b = || col(s, "b");
    let f = || col(s, "f");
    let p = || col(s, "p");
    vec![
        bin(a(), Operator::Gt, lit(ScalarValue::Int32(Some(2)))),
        bin(a(), Operator::Eq, lit(ScalarValue::Int32(None))),
        bin(
            bin(a(), Operator::LtEq, lit(ScalarValue::Int32(Some(0)))),
            Operator::And,
            p(),
        ),
        bin(
            bin(a(), Operator::LtEq, lit(ScalarValue::Int32(Some(0)))),
            Operator::Or,
            p(),
        ),
        Arc::new(NotExpr::new(bin(
            p(),
            Operator::Or,
            bin(b(), Operator::NotEq, lit(ScalarValue::Int64(Some(3)))),
        ))),
        bin(f(), Operator::Gt, lit(ScalarValue::Float64(Some(1.5)))),
        bin(f(), Operator::Eq, lit(ScalarValue::Float64(Some(f64::NAN)))),
        bin(f(), Operator::Lt, lit(ScalarValue::Float64(Some(0.0)))),
        bin(f(), Operator::GtEq, lit(ScalarValue::Float64(Some(-0.0)))),
        bin(
            bin(b(), Operator::Multiply, b()),
            Operator::Gt,
            bin(b(), Operator::Plus, lit(ScalarValue::Int64(Some(i64::MAX)))),
        ),
        bin(
            bin(f(), Operator::Minus, f()),
            Operator::Eq,
            lit(ScalarValue::Float64(Some(0.0))),
        ),
        // inf - inf is -NaN on the CPU, which is below every number in total order.
        bin(
            bin(f(), Operator::Minus, f()),
            Operator::Gt,
            lit(ScalarValue::Float64(Some(1.0))),
        ),
        Arc::new(IsNullExpr::new(b())),
        Arc::new(IsNotNullExpr::new(f())),
        bin(
            bin(
                col(s, "d"),
                Operator::GtEq,
                lit(ScalarValue::Date32(Some(10_010))),
            ),
            Operator::And,
            bin(
                col(s, "d"),
                Operator::Lt,
                lit(ScalarValue::Date32(Some(10_020))),
            ),
        ),
        bin(
            col(s, "m"),
            Operator::LtEq,
            lit(ScalarValue::Decimal128(Some(7), 15, 2)),
        ),
        bin(
            col(s, "u"),
            Operator::Gt,
            lit(ScalarValue::UInt8(Some(200))),
        ),
        bin(
            bin(
                col(s, "u"),
                Operator::Plus,
                lit(ScalarValue::UInt8(Some(100))),
            ),
            Operator::Lt,
            lit(ScalarValue::UInt8(Some(50))),
        ),
        lit(ScalarValue::Boolean(Some(true))),
        in_list(
            a(),
            vec![
                lit(ScalarValue::Int32(Some(1))),
                lit(ScalarValue::Int32(Some(-3))),
                lit(ScalarValue::Int32(None)),
            ],
            &false,
            s,
        )
        .unwrap(),
        in_list(
            a(),
            vec![
                lit(ScalarValue::Int32(Some(1))),
                lit(ScalarValue::Int32(Some(2))),
            ],
            &true,
            s,
        )
        .unwrap(),
        in_list(
            f(),
            vec![
                lit(ScalarValue::Float64(Some(f64::NAN))),
                lit(ScalarValue::Float64(Some(-0.0))),
            ],
            &false,
            s,
        )
        .unwrap(),
        Arc::new(
            CaseExpr::try_new(
                None,
                vec![
                    (
                        bin(a(), Operator::Gt, lit(ScalarValue::Int32(Some(0)))),
                        p(),
                    ),
                    (
                        Arc::new(IsNullExpr::new(a())),
                        lit(ScalarValue::Boolean(Some(true))),
                    ),
                ],
                None,
            )
            .unwrap(),
        ),
    ]
}

#[test]
fn generated_predicates_match_datafusion() {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let stream = device.new_stream().unwrap();
    for n in [0usize, 1, 33, 2000] {
        let host = batch(n, n as u64 + 1);
        let schema = host.schema();
        let on_device = upload_batch(&stream, &host).unwrap();
        for pred in predicates(&schema) {
            let pk =
                predicate_kernel(pred.as_ref(), &schema).unwrap_or_else(|e| panic!("{pred}: {e}"));
            if n == 0 && spate_kernels::compile::nvrtc_version().is_ok() {
                // The same source must also compile for a GPU.
                let resolved =
                    spate_kernels::source::resolve(&pk.entry, &pk.source, false).unwrap();
                spate_kernels::compile::nvrtc_compile(&pk.entry, &resolved, "sm_90", &[])
                    .unwrap_or_else(|e| panic!("{pred}: {e}"));
            }
            let kernel = device
                .compile_generated(&pk.entry, &pk.source, &[&pk.entry])
                .unwrap()
                .remove(0);
            let mask = evaluate_predicate(&stream, &kernel, &pk, &on_device).unwrap();
            let got = stream.to_vec(&mask).unwrap();
            let want = pred.evaluate(&host).unwrap().into_array(n).unwrap();
            let want = want.as_any().downcast_ref::<BooleanArray>().unwrap();
            for (i, g) in got.iter().enumerate() {
                let keep = want.is_valid(i) && want.value(i);
                assert_eq!(*g == 1, keep, "`{pred}` row {i} of {n}");
            }
        }
    }
}

#[test]
fn unsupported_expressions_say_what() {
    let host = batch(1, 1);
    let s = host.schema();
    let shift = bin(
        col(&s, "a"),
        Operator::BitwiseShiftLeft,
        lit(ScalarValue::Int32(Some(2))),
    );
    let pred = bin(shift, Operator::Gt, lit(ScalarValue::Int32(Some(1))));
    assert!(predicate_kernel(pred.as_ref(), &s).is_ok());
    let regex = bin(col(&s, "a"), Operator::RegexMatch, col(&s, "a"));
    let err = predicate_kernel(regex.as_ref(), &s).unwrap_err();
    assert!(err.0.contains("operator ~"), "{err}");
    let mixed = bin(col(&s, "a"), Operator::Gt, col(&s, "b"));
    assert!(predicate_kernel(mixed.as_ref(), &s).is_err());
    // A division that can fail runs on the right of AND, its checks raised only where the left
    // is not FALSE; a WHEN that rules zero out drops them.
    let quotient = || bin(col(&s, "b"), Operator::Divide, col(&s, "b"));
    let unguarded = bin(
        col(&s, "p"),
        Operator::And,
        bin(quotient(), Operator::Gt, lit(ScalarValue::Int64(Some(1)))),
    );
    let kernel = predicate_kernel(unguarded.as_ref(), &s).unwrap();
    assert!(!kernel.checks.is_empty());
    assert!(kernel.source.contains("atomicOr(err"), "{}", kernel.source);
    let guarded: E = Arc::new(
        CaseExpr::try_new(
            None,
            vec![(
                bin(col(&s, "b"), Operator::Gt, lit(ScalarValue::Int64(Some(0)))),
                quotient(),
            )],
            None,
        )
        .unwrap(),
    );
    let guarded = bin(
        col(&s, "p"),
        Operator::And,
        bin(guarded, Operator::Gt, lit(ScalarValue::Int64(Some(1)))),
    );
    let kernel = predicate_kernel(guarded.as_ref(), &s).unwrap();
    assert!(kernel.checks.is_empty(), "{:?}", kernel.checks);
}

#[test]
fn the_same_predicate_generates_the_same_entry() {
    let host = batch(1, 1);
    let s = host.schema();
    let p1 = predicate_kernel(predicates(&s)[2].as_ref(), &s).unwrap();
    let p2 = predicate_kernel(predicates(&s)[2].as_ref(), &s).unwrap();
    assert_eq!(p1.entry, p2.entry);
    assert_ne!(
        p1.entry,
        predicate_kernel(predicates(&s)[3].as_ref(), &s)
            .unwrap()
            .entry
    );
    assert_eq!(p1.inputs.len(), 2);
}

fn values(s: &Schema) -> Vec<E> {
    let a = || col(s, "a");
    let b = || col(s, "b");
    let f = || col(s, "f");
    let m = || col(s, "m");
    let dec = |v: i128, p: u8, sc: i8| lit(ScalarValue::Decimal128(Some(v), p, sc));
    let cast = |e: E, t: DataType| -> E { Arc::new(CastExpr::new(e, t, None)) };
    vec![
        a(),
        bin(a(), Operator::Plus, lit(ScalarValue::Int32(Some(i32::MAX)))),
        bin(b(), Operator::Multiply, b()),
        bin(f(), Operator::Minus, lit(ScalarValue::Float64(Some(0.25)))),
        // inf - inf and 0 * inf create NaNs; a NaN input propagates its own. (Which of two
        // NaN inputs wins is unspecified even on the CPU, so that case is not checked.)
        bin(f(), Operator::Minus, f()),
        bin(
            f(),
            Operator::Multiply,
            lit(ScalarValue::Float64(Some(f64::INFINITY))),
        ),
        bin(a(), Operator::Gt, lit(ScalarValue::Int32(Some(0)))),
        bin(
            col(s, "p"),
            Operator::And,
            bin(a(), Operator::Lt, lit(ScalarValue::Int32(Some(5)))),
        ),
        // Decimals: DataFusion's result types, rescaled operands.
        bin(
            m(),
            Operator::Multiply,
            bin(dec(1, 20, 0), Operator::Minus, m()),
        ),
        bin(m(), Operator::Plus, dec(12_345, 10, 4)),
        bin(m(), Operator::Multiply, m()),
        cast(a(), DataType::Int64),
        cast(a(), DataType::Float64),
        cast(a(), DataType::Decimal128(20, 3)),
        cast(m(), DataType::Decimal128(25, 6)),
        cast(col(s, "u"), DataType::Int32),
        Arc::new(NegativeExpr::new(b())),
        Arc::new(NegativeExpr::new(f())),
        Arc::new(NegativeExpr::new(m())),
        lit(ScalarValue::Decimal128(Some(-(1i128 << 100)), 38, 0)),
        Arc::new(
            CaseExpr::try_new(
                None,
                vec![
                    (
                        bin(a(), Operator::Gt, lit(ScalarValue::Int32(Some(2)))),
                        b(),
                    ),
                    (
                        col(s, "p"),
                        bin(b(), Operator::Minus, lit(ScalarValue::Int64(Some(1)))),
                    ),
                ],
                Some(lit(ScalarValue::Int64(Some(-7)))),
            )
            .unwrap(),
        ),
        Arc::new(
            CaseExpr::try_new(
                None,
                vec![(
                    bin(f(), Operator::Lt, lit(ScalarValue::Float64(Some(0.0)))),
                    f(),
                )],
                None,
            )
            .unwrap(),
        ),
    ]
}

#[test]
fn generated_values_match_datafusion() {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let stream = device.new_stream().unwrap();
    for n in [0usize, 1, 33, 1500] {
        let host = batch(n, n as u64 + 7);
        let schema = host.schema();
        let on_device = upload_batch(&stream, &host).unwrap();
        let exprs = values(&schema);
        let refs: Vec<&dyn PhysicalExpr> = exprs.iter().map(|e| e.as_ref()).collect();
        let vk = value_kernel(&refs, &schema).unwrap_or_else(|e| panic!("{e}"));
        if n == 0 && spate_kernels::compile::nvrtc_version().is_ok() {
            let resolved = spate_kernels::source::resolve(&vk.entry, &vk.source, false).unwrap();
            spate_kernels::compile::nvrtc_compile(&vk.entry, &resolved, "sm_90", &[])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let kernel = compile(&device, &vk);
        let columns = evaluate_values(&stream, &kernel, &vk, &on_device).unwrap();
        for (expr, column) in exprs.iter().zip(&columns) {
            let got = crate::column::download_column(&stream, column).unwrap();
            let want = expr.evaluate(&host).unwrap().into_array(n).unwrap();
            assert_eq!(got.data_type(), want.data_type(), "`{expr}`");
            assert_eq!(got.as_ref(), want.as_ref(), "`{expr}` n={n}");
            assert_eq!(got.null_count(), want.null_count(), "`{expr}`");
        }
    }
}

#[test]
fn value_kernels_without_strings_or_checks_read_nothing_back() {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let stream = device.new_stream().unwrap();
    let host = batch(1500, 3);
    let schema = host.schema();
    let s = schema.as_ref();
    let exprs: Vec<E> = vec![
        bin(col(s, "a"), Operator::Gt, lit(ScalarValue::Int32(Some(2)))),
        col(s, "f"),
    ];
    let refs: Vec<&dyn PhysicalExpr> = exprs.iter().map(|e| e.as_ref()).collect();
    let vk = value_kernel(&refs, &schema).unwrap_or_else(|e| panic!("{e}"));
    assert!(vk.checks.is_empty(), "these expressions need no checks");
    let kernel = compile(&device, &vk);
    let on_device = upload_batch(&stream, &host).unwrap();
    let before = device.counters();
    let columns = evaluate_values(&stream, &kernel, &vk, &on_device).unwrap();
    let spent = device.counters() - before;
    assert_eq!((spent.host_syncs, spent.d2h_bytes), (0, 0), "{spent:?}");
    for (expr, column) in exprs.iter().zip(&columns) {
        // The null count stays on the device until asked for.
        assert_eq!(column.null_count(), None, "`{expr}`");
        let want = expr.evaluate(&host).unwrap().into_array(1500).unwrap();
        assert_eq!(column.count_nulls(&stream).unwrap(), want.null_count());
        let got = crate::column::download_column(&stream, column).unwrap();
        assert_eq!(got.as_ref(), want.as_ref(), "`{expr}`");
    }
}

/// A decimal cast that widens both sides of the point cannot fail: it needs no check, so its
/// kernel reads nothing back, as TPC-H q17's `CAST(l_quantity AS DECIMAL(30, 15))`. One that
/// narrows keeps its check, and a kernel whose only readback is that check reads 4 bytes.
#[test]
fn widening_decimal_casts_need_no_check() {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let stream = device.new_stream().unwrap();
    let host = batch(1500, 5);
    let schema = host.schema();
    let s = schema.as_ref();
    let cast = |t: DataType| -> E { Arc::new(CastExpr::new(col(s, "m"), t, None)) };
    let on_device = upload_batch(&stream, &host).unwrap();
    let cases = [
        (DataType::Decimal128(30, 15), false),
        (DataType::Decimal128(15, 2), false),
        (DataType::Decimal128(17, 4), false),
        // One digit fewer before the point, or after it.
        (DataType::Decimal128(16, 4), true),
        (DataType::Decimal128(30, 1), true),
    ];
    for (to, checked) in cases {
        let e = cast(to.clone());
        let vk = value_kernel(&[e.as_ref()], &schema).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(!vk.checks.is_empty(), checked, "{to}: {}", vk.source);
        let kernel = compile(&device, &vk);
        let before = device.counters();
        let columns = evaluate_values(&stream, &kernel, &vk, &on_device);
        let spent = device.counters() - before;
        let want = e.evaluate(&host).and_then(|v| v.into_array(1500));
        match (columns, want) {
            (Ok(columns), Ok(want)) => {
                let got = crate::column::download_column(&stream, &columns[0]).unwrap();
                assert_eq!(got.as_ref(), want.as_ref(), "{to}");
            }
            (Err(_), Err(_)) => assert!(checked, "{to}"),
            (got, want) => panic!("{to}: GPU {:?}, CPU {:?}", got.is_ok(), want.is_ok()),
        }
        let read = if checked { (1, 4) } else { (0, 0) };
        assert_eq!((spent.host_syncs, spent.d2h_bytes), read, "{to}: {spent:?}");
    }
}

/// A float cast to a decimal needs a check unless the float's bounds fit the decimal: shown
/// from its decimal columns' precision through DataFusion's interval arithmetic, as in TPC-H
/// q17's `CAST(0.2 * CAST(avg(l_quantity) AS DOUBLE) AS DECIMAL(30, 15))`. Either way the
/// values are the CPU's.
#[test]
fn float_to_decimal_casts_of_bounded_values_need_no_check() {
    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let stream = device.new_stream().unwrap();
    let host = batch(1500, 6);
    let schema = host.schema();
    let s = schema.as_ref();
    let m_as_f64: E = Arc::new(CastExpr::new(col(s, "m"), DataType::Float64, None));
    let scaled = |by: f64| {
        bin(
            Arc::clone(&m_as_f64),
            Operator::Multiply,
            lit(ScalarValue::Float64(Some(by))),
        )
    };
    let to = DataType::Decimal128(30, 15);
    let on_device = upload_batch(&stream, &host).unwrap();
    let cases: [(E, bool); 4] = [
        // |m| < 10^13, times 0.2: within 10^15.
        (scaled(0.2), false),
        (Arc::clone(&m_as_f64), false),
        // Times 1000: up to 10^16, past it.
        (scaled(1000.0), true),
        // A float column has no bound.
        (col(s, "f"), true),
    ];
    for (input, checked) in cases {
        let e: E = Arc::new(CastExpr::new(input, to.clone(), None));
        let vk = value_kernel(&[e.as_ref()], &schema).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(!vk.checks.is_empty(), checked, "{e}: {}", vk.source);
        let kernel = compile(&device, &vk);
        let got = evaluate_values(&stream, &kernel, &vk, &on_device);
        let want = e.evaluate(&host).and_then(|v| v.into_array(1500));
        match (got, want) {
            (Ok(got), Ok(want)) => {
                let got = crate::column::download_column(&stream, &got[0]).unwrap();
                assert_eq!(got.as_ref(), want.as_ref(), "{e}");
            }
            (Err(_), Err(_)) => assert!(checked, "{e}"),
            (got, want) => panic!("{e}: GPU {:?}, CPU {:?}", got.is_ok(), want.is_ok()),
        }
    }
}

#[test]
fn decimal_shapes_that_could_overflow_run_checked_but_not_in_branches() {
    let host = batch(1, 1);
    let s = host.schema();
    let big = lit(ScalarValue::Decimal128(Some(1), 38, 0));
    let e = bin(col(&s, "m"), Operator::Multiply, big);
    let vk = value_kernel(&[e.as_ref()], &s).unwrap();
    assert_eq!(vk.checks.len(), 1, "{}", vk.source);
    assert!(vk.source.contains("u32* err"), "{}", vk.source);
    // The CPU evaluates the right side of OR for the rows whose left side is not TRUE (and
    // perhaps others, as its batches fall): an overflow fails the query only in those.
    let cond = bin(
        bin(col(&s, "a"), Operator::Gt, lit(ScalarValue::Int32(Some(0)))),
        Operator::Or,
        bin(
            e,
            Operator::Gt,
            lit(ScalarValue::Decimal128(Some(0), 38, 2)),
        ),
    );
    let kernel = predicate_kernel(cond.as_ref(), &s).unwrap();
    assert_eq!(kernel.checks.len(), 1, "{}", kernel.source);
    let raise = kernel
        .source
        .lines()
        .find(|l| l.contains("atomicOr(err"))
        .unwrap();
    assert!(raise.contains("|| !"), "{raise}");
}

#[test]
fn string_outputs_hold_exactly_their_bytes() {
    use arrow::array::StringArray;
    use datafusion::common::DFSchema;
    use datafusion::execution::context::ExecutionProps;
    use datafusion::functions::unicode::expr_fn::substring;
    use datafusion::prelude::{col as logical_col, lit as logical_lit};

    let device = Device::emulated(DeviceOptions::default()).unwrap();
    let stream = device.new_stream().unwrap();
    let host = RecordBatch::try_from_iter([(
        "s",
        Arc::new(StringArray::from(vec![
            Some("apple"),
            None,
            Some(""),
            Some("héllo wörld"),
        ])) as ArrayRef,
    )])
    .unwrap();
    let schema = host.schema();
    let df_schema = DFSchema::try_from(schema.as_ref().clone()).unwrap();
    let props = ExecutionProps::new();
    let planning =
        datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext::default();
    // Some bytes, and none at all (every string empty or NULL).
    let exprs: Vec<E> = [(2, 3), (100, 2)]
        .iter()
        .map(|&(start, count)| {
            let e = substring(
                logical_col("s"),
                logical_lit(start as i64),
                logical_lit(count as i64),
            );
            datafusion::physical_expr::create_physical_expr(&e, &df_schema, &props, &planning)
                .unwrap()
        })
        .collect();
    let refs: Vec<&dyn PhysicalExpr> = exprs.iter().map(|e| e.as_ref()).collect();
    let vk = value_kernel(&refs, &schema).unwrap_or_else(|e| panic!("{e}"));
    let kernel = compile(&device, &vk);
    let on_device = upload_batch(&stream, &host).unwrap();
    let before = device.counters();
    let columns = evaluate_values(&stream, &kernel, &vk, &on_device).unwrap();
    // Both outputs' byte totals (and the error word, if any) come back in one readback.
    let spent = device.counters() - before;
    let words = 2 + u64::from(!vk.checks.is_empty());
    assert_eq!(
        (spent.host_syncs, spent.d2h_bytes),
        (1, 8 * words),
        "{spent:?}"
    );
    for ((expr, column), bytes) in exprs.iter().zip(&columns).zip([7, 0]) {
        let crate::column::DeviceValues::LargeUtf8 { bytes: data, .. } = column.values() else {
            panic!("`{expr}`: strings expected");
        };
        assert_eq!(data.len(), bytes, "`{expr}`");
        let got = crate::column::download_column(&stream, column).unwrap();
        let want = expr.evaluate(&host).unwrap().into_array(4).unwrap();
        assert_eq!(got.as_ref(), want.as_ref(), "`{expr}`");
        assert_eq!(got.null_count(), 1, "`{expr}`");
    }
}
