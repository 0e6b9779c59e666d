//! Physical planning: where the GPU offload rule sits in DataFusion's optimizer pipeline.
//!
//! DataFusion plans every query for the CPU. A GPU backend then rewrites the finished physical
//! plan with one [`PhysicalOptimizerRule`] that swaps maximal subtrees of supported operators
//! for GPU operators. That rule must run after DataFusion has placed every exchange, sort,
//! partial/final aggregate, limit and projection (so that it sees the real host/device
//! boundaries), and before `EnsureCooperative` and `SanityCheckPlan` (so that cooperative
//! scheduling and requirement checks see the GPU nodes). See `docs/ARCHITECTURE.md`.

pub mod devices;
pub mod in_order;
pub mod nearest;
pub mod offload;
pub mod regions;
pub mod unique;

use std::sync::Arc;

use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;

pub use offload::GpuOffloadRule;

/// A physical optimizer rule as the session state stores it.
pub type PhysicalRule = Arc<dyn PhysicalOptimizerRule + Send + Sync>;

/// The offload rule is inserted immediately before the rule of this name.
pub const OFFLOAD_ANCHOR_RULE: &str = "EnsureCooperative";

/// DataFusion's default physical optimizer rules, then [`in_order::InOrderInputs`] and
/// `offload` (when given), in that order, just before [`OFFLOAD_ANCHOR_RULE`].
///
/// If a future DataFusion drops the anchor rule, they go before the final `SanityCheckPlan`
/// instead, and failing that at the end, so that a GPU backend is never silently left out of
/// planning.
pub fn physical_optimizer_rules(offload: Option<PhysicalRule>) -> Vec<PhysicalRule> {
    let mut rules = PhysicalOptimizer::new().rules;
    let position = rules
        .iter()
        .position(|r| r.name() == OFFLOAD_ANCHOR_RULE)
        .or_else(|| rules.iter().position(|r| r.name() == "SanityCheckPlan"))
        .unwrap_or(rules.len());
    let mut ours: Vec<PhysicalRule> = vec![Arc::new(in_order::InOrderInputs)];
    ours.extend(offload);
    rules.splice(position..position, ours);
    rules
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use datafusion::common::config::ConfigOptions;
    use datafusion::error::Result;
    use datafusion::physical_plan::ExecutionPlan;

    use super::*;

    #[derive(Debug, Default)]
    struct CountingRule {
        calls: AtomicUsize,
    }

    impl PhysicalOptimizerRule for CountingRule {
        fn optimize(
            &self,
            plan: Arc<dyn ExecutionPlan>,
            _config: &ConfigOptions,
        ) -> Result<Arc<dyn ExecutionPlan>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(plan)
        }
        fn name(&self) -> &str {
            "TestOffload"
        }
        fn schema_check(&self) -> bool {
            true
        }
    }

    #[test]
    fn without_offload_the_defaults_gain_only_the_in_order_rule() {
        let names: Vec<String> = physical_optimizer_rules(None)
            .iter()
            .map(|r| r.name().to_string())
            .filter(|n| n != "InOrderInputs")
            .collect();
        let defaults: Vec<String> = PhysicalOptimizer::new()
            .rules
            .iter()
            .map(|r| r.name().to_string())
            .collect();
        assert_eq!(names, defaults);
        let rules = physical_optimizer_rules(None);
        let at = rules.iter().position(|r| r.name() == "InOrderInputs");
        assert_eq!(rules[at.unwrap() + 1].name(), OFFLOAD_ANCHOR_RULE);
    }

    #[test]
    fn offload_sits_just_before_ensure_cooperative() {
        let rules = physical_optimizer_rules(Some(Arc::new(CountingRule::default())));
        let at = rules
            .iter()
            .position(|r| r.name() == "TestOffload")
            .unwrap();
        assert_eq!(rules[at + 1].name(), OFFLOAD_ANCHOR_RULE);
        // Everything that places exchanges, sorts and limits runs before it.
        for earlier in [
            "EnsureRequirements",
            "LimitPushdown",
            "ProjectionPushdown",
            "InOrderInputs",
        ] {
            let p = rules.iter().position(|r| r.name() == earlier).unwrap();
            assert!(p < at, "{earlier} must run before the offload rule");
        }
        assert_eq!(rules.last().unwrap().name(), "SanityCheckPlan");
    }

    #[tokio::test]
    async fn an_engine_with_an_offload_rule_runs_it_on_every_query() {
        let rule = Arc::new(CountingRule::default());
        let engine = crate::Engine::builder()
            .backend(crate::Backend::Cpu)
            .offload_rule(Arc::clone(&rule) as PhysicalRule)
            .build()
            .unwrap();
        let batches = engine.collect("SELECT 1 + 1 AS two").await.unwrap();
        assert_eq!(batches[0].num_rows(), 1);
        assert_eq!(rule.calls.load(Ordering::SeqCst), 1);
    }
}
