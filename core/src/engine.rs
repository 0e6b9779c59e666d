//! The embeddable engine: a DataFusion session configured for Spate, table registration and SQL.
//!
//! ```text
//!   SQL ─▶ DFParser ─▶ logical plan ─▶ DataFusion optimizer ─▶ physical plan
//!          (statements)                 (+ Spate's offload slot, see crate::plan) ─▶ streams
//! ```
//!
//! Contract: every method returns [`SpateError`] for bad input (SQL, paths, settings) and never
//! panics on it. Row order of results is only defined where the query has an ORDER BY.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{ArrayRef, StringArray};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::MemTable;
use datafusion::common::TableReference;
use datafusion::common::format::ExplainFormat;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::file_format::options::ArrowReadOptions;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::{DdlStatement, Explain, LogicalPlan};
use datafusion::prelude::{
    CsvReadOptions, JsonReadOptions, ParquetReadOptions, SessionConfig, SessionContext,
};
use datafusion::sql::parser::{DFParserBuilder, Statement};
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use datafusion::sql::sqlparser::dialect::dialect_from_str;

use crate::cache::{CacheLocation, CachedTable, HostCachedTableProvider, original_provider};
use crate::config::SpateOptions;
use crate::config::{Backend, Devices};
use crate::device::{BackendSelection, GpuContext};
use crate::error::{Location, Result, SpateError};
use crate::plan::GpuOffloadRule;
use crate::plan::{PhysicalRule, physical_optimizer_rules};
use crate::source::FileFormat;
use crate::stream::{
    CheckpointStream, Feed, FolderTail, StreamInfo, StreamWriter, Subscription, WindowFunctionKind,
    WindowTableFunction,
};

/// Configures and builds an [`Engine`].
#[derive(Debug, Default)]
pub struct EngineBuilder {
    backend: Backend,
    target_partitions: Option<usize>,
    batch_size: Option<usize>,
    memory_limit_bytes: Option<usize>,
    gpu_memory_limit_bytes: Option<usize>,
    devices: Devices,
    /// A Ballista scheduler queries go to (`EngineBuilder::remote`).
    remote: Option<String>,
    options: Vec<(String, String)>,
    offload_rule: Option<PhysicalRule>,
}

impl EngineBuilder {
    /// Where operators run; `auto` (the default) picks a GPU when one is usable.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// How many partitions each query runs with; defaults to the number of CPU cores.
    pub fn target_partitions(mut self, partitions: usize) -> Self {
        self.target_partitions = Some(partitions);
        self
    }

    /// Rows per batch that operators aim for; DataFusion's default is 8192.
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = Some(rows);
        self
    }

    /// Caps the host memory that buffering operators (sort, aggregate, join) may reserve;
    /// beyond it they spill or fail with an out-of-memory error.
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit_bytes = Some(bytes);
        self
    }

    /// Caps the GPU memory the session's device pool may hold (default: 80% of the device's
    /// free memory). An operator that needs more fails with an out-of-memory error.
    pub fn gpu_memory_limit(mut self, bytes: usize) -> Self {
        self.gpu_memory_limit_bytes = Some(bytes);
        self
    }

    /// The devices a GPU backend runs on (default: one). With several, each GPU subtree runs
    /// one partition per device, with exchanges between devices (see `plan/devices.rs`); each
    /// device has a memory pool of [`EngineBuilder::gpu_memory_limit`].
    pub fn devices(mut self, devices: Devices) -> Self {
        self.devices = devices;
        self
    }

    /// Sends queries to the Ballista scheduler at `url` (`df://host:port`, port 50050 by
    /// default): it plans them and its executors (`spate executor`) run them, on their GPUs.
    /// Tables must be files the executors can read (`register_file`); the backend and device
    /// settings are the executors' own.
    #[cfg(feature = "remote")]
    pub fn remote(mut self, url: impl Into<String>) -> Self {
        self.remote = Some(url.into());
        self
    }

    /// Sets any DataFusion configuration key, e.g. `datafusion.execution.batch_size`.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.push((key.into(), value.into()));
        self
    }

    /// Installs a physical optimizer rule in the GPU offload slot (see [`crate::plan`]).
    pub fn offload_rule(mut self, rule: PhysicalRule) -> Self {
        self.offload_rule = Some(rule);
        self
    }

    /// Resolves the backend and builds the session.
    pub fn build(self) -> Result<Engine> {
        let mut selection = match &self.remote {
            // The executors run the operators; this session only plans and collects.
            Some(url) => BackendSelection::remote(self.backend, url),
            None => BackendSelection::resolve(self.backend)?,
        };
        let gpu = if selection.uses_gpu() {
            let budget = match self.gpu_memory_limit_bytes {
                Some(bytes) => spate_kernels::MemoryBudget::Bytes(bytes),
                None => spate_kernels::MemoryBudget::default(),
            };
            let available = selection
                .inventory
                .as_ref()
                .map_or(1, |i| i.devices.len().max(1));
            match GpuContext::open(selection.resolved, budget, &self.devices, available)
                .and_then(|g| g.smoke_test().map(|()| g))
            {
                Ok(g) => Some(g),
                Err(e) => {
                    selection = selection.after_gpu_failure(e)?;
                    None
                }
            }
        } else {
            None
        };
        log::info!("{selection}");

        let mut config = SessionConfig::new()
            .with_information_schema(true)
            .with_option_extension(SpateOptions::default());
        if let Some(g) = &gpu {
            config = config.with_extension(Arc::clone(g));
        }
        if let Some(partitions) = self.target_partitions {
            if partitions == 0 {
                return Err(config_error("target_partitions must be at least 1"));
            }
            config = config.with_target_partitions(partitions);
        }
        if let Some(rows) = self.batch_size {
            if rows == 0 {
                return Err(config_error("batch_size must be at least 1"));
            }
            config = config.with_batch_size(rows);
        }
        // Spans let planning errors point at the offending part of the statement.
        config.options_mut().sql_parser.collect_spans = true;
        // Dynamic filters stay on with a GPU backend: they are created after the offload rule
        // (by `FilterPushdown(Post)`), only by the hash joins, TopK sorts and MIN/MAX
        // aggregates that stayed on the CPU, and they do not cross GPU operators (which take
        // no part in filter pushdown), so CPU operators keep theirs.
        for (key, value) in &self.options {
            config
                .options_mut()
                .set(key, value)
                .map_err(|e| config_error(&format!("{key} = {value}: {e}")))?;
        }

        let mut runtime = RuntimeEnvBuilder::new();
        if let Some(bytes) = self.memory_limit_bytes {
            runtime = runtime.with_memory_limit(bytes, 1.0);
        }
        let runtime = runtime.build_arc()?;
        let offload = self.offload_rule.or_else(|| {
            gpu.as_ref()
                .map(|g| Arc::new(GpuOffloadRule::new(Arc::clone(g))) as PhysicalRule)
        });

        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime)
            .with_default_features()
            .with_physical_optimizer_rules(physical_optimizer_rules(offload))
            .build();
        let state = match &self.remote {
            Some(url) => remote_state(state, url)?,
            None => state,
        };
        let ctx = SessionContext::new_with_state(state);
        crate::vector::register(&ctx);
        ctx.register_udtf(
            crate::vector::table_function::NAME,
            Arc::new(crate::vector::VectorTopKFunction),
        );
        for kind in [
            WindowFunctionKind::Tumble,
            WindowFunctionKind::Hop,
            WindowFunctionKind::Session,
        ] {
            // DataFusion looks table functions up by the name as written.
            let function = Arc::new(WindowTableFunction::new(kind));
            ctx.register_udtf(kind.name(), Arc::clone(&function) as _);
            ctx.register_udtf(&kind.name().to_uppercase(), function);
        }
        let gpu: Option<Arc<GpuContext>> = gpu;
        Ok(Engine {
            streams: Arc::new(crate::stream::Catalog::new(ctx.clone(), gpu.clone())),
            ctx,
            selection,
            gpu,
            remote: self.remote,
            cached: Arc::new(Mutex::new(HashMap::new())),
        })
    }
}

/// The columns of a `CACHE TABLE`'s `SHARDED BY` (its `spate.sharded_by` option); an unknown
/// option is an error.
fn sharded_by_option(
    options: &[datafusion::sql::sqlparser::ast::SqlOption],
) -> Result<Vec<String>> {
    use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, SqlOption, Value};
    let mut columns = Vec::new();
    for option in options {
        match option {
            SqlOption::KeyValue { key, value }
                if key.value == crate::rewrite::SHARDED_BY_OPTION =>
            {
                if let SqlExpr::Value(v) = value
                    && let Value::SingleQuotedString(list) = &v.value
                {
                    columns.extend(list.split(',').filter(|c| !c.is_empty()).map(String::from));
                }
            }
            other => {
                return Err(SpateError::Unsupported {
                    message: format!(
                        "CACHE TABLE option {other} is not supported (CACHE TABLE name \
                         SHARDED BY (columns) shards it over the devices)"
                    ),
                });
            }
        }
    }
    Ok(columns)
}

/// `state` sending its queries to the Ballista scheduler at `url`.
#[cfg(feature = "remote")]
fn remote_state(
    state: datafusion::execution::SessionState,
    url: &str,
) -> Result<datafusion::execution::SessionState> {
    use ballista_core::extension::SessionStateExt;
    Ok(state.upgrade_for_ballista(scheduler_address(url)?)?)
}

#[cfg(not(feature = "remote"))]
fn remote_state(
    _state: datafusion::execution::SessionState,
    url: &str,
) -> Result<datafusion::execution::SessionState> {
    Err(SpateError::Unsupported {
        message: format!("remote sessions ({url}) need Spate built with its `remote` feature"),
    })
}

/// The gRPC address of a scheduler given as `df://host[:port]` (or `http://…`, or
/// `host[:port]`); the port defaults to Ballista's 50050.
pub fn scheduler_address(url: &str) -> Result<String> {
    let bad = |why: &str| SpateError::Config {
        message: format!("remote scheduler '{url}': {why}; expected df://host:port"),
    };
    let rest = url
        .strip_prefix("df://")
        .or_else(|| url.strip_prefix("http://"))
        .unwrap_or(url)
        .trim_end_matches('/');
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) => (
            host,
            port.parse::<u16>()
                .map_err(|_| bad("the port is not a number"))?,
        ),
        None => (rest, 50050),
    };
    if host.is_empty() || host.contains('/') {
        return Err(bad("no host"));
    }
    Ok(format!("http://{host}:{port}"))
}

fn config_error(message: &str) -> SpateError {
    SpateError::Config {
        message: message.to_string(),
    }
}

/// A Spate session: registered tables, settings and a chosen backend.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let engine = spate::Engine::builder().backend(spate::Backend::Cpu).build()?;
/// let batches = engine.collect("SELECT 40 + 2 AS answer").await?;
/// assert_eq!(batches[0].num_rows(), 1);
/// # Ok::<(), spate::SpateError>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Engine {
    ctx: SessionContext,
    selection: BackendSelection,
    gpu: Option<Arc<GpuContext>>,
    /// The scheduler of a remote session.
    remote: Option<String>,
    /// Tables held in memory by `CACHE TABLE`, by name (shared by clones of the engine).
    cached: Arc<Mutex<HashMap<String, CachedTable>>>,
    /// Streams and continuous views (shared by clones of the engine).
    streams: Arc<crate::stream::Catalog>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("session_id", &self.ctx.session_id())
            .field("backend", &self.selection)
            .finish()
    }
}

impl Engine {
    /// A builder with default settings (`auto` backend).
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// An engine with default settings.
    pub fn new() -> Result<Self> {
        Self::builder().build()
    }

    /// The session's GPU, when the backend is `cuda` or `emulated`.
    pub fn gpu(&self) -> Option<&Arc<GpuContext>> {
        self.gpu.as_ref()
    }

    /// The backend this engine resolved to, and why.
    pub fn backend(&self) -> &BackendSelection {
        &self.selection
    }

    /// The scheduler queries go to, in a remote session (`EngineBuilder::remote`).
    pub fn remote(&self) -> Option<&str> {
        self.remote.as_deref()
    }

    /// The underlying DataFusion session, for anything Spate does not wrap.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Registers a file or folder under `name`, detecting the format from its extension.
    pub async fn register(&self, name: &str, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let (format, extension) = FileFormat::detect(path)?;
        self.register_detected(name, path, format, &extension).await
    }

    /// Registers a Parquet file or folder of Parquet files.
    pub async fn register_parquet(&self, name: &str, path: impl AsRef<Path>) -> Result<()> {
        self.register_format(name, path, FileFormat::Parquet).await
    }

    /// Registers a CSV file (with a header row) or folder of CSV files.
    pub async fn register_csv(&self, name: &str, path: impl AsRef<Path>) -> Result<()> {
        self.register_format(name, path, FileFormat::Csv).await
    }

    /// Registers a newline-delimited JSON file or folder.
    pub async fn register_ndjson(&self, name: &str, path: impl AsRef<Path>) -> Result<()> {
        self.register_format(name, path, FileFormat::NdJson).await
    }

    /// Registers an Arrow IPC file or folder.
    pub async fn register_arrow(&self, name: &str, path: impl AsRef<Path>) -> Result<()> {
        self.register_format(name, path, FileFormat::ArrowIpc).await
    }

    /// Registers a file or folder in the given format. The format wins over a file's
    /// extension; a folder is read through the extension of its files, which must be of
    /// that format.
    pub async fn register_format(
        &self,
        name: &str,
        path: impl AsRef<Path>,
        format: FileFormat,
    ) -> Result<()> {
        let path = path.as_ref();
        let extension = if path.is_file() {
            path.extension()
                .map(|e| e.to_string_lossy().into_owned())
                .unwrap_or_default()
        } else {
            let (detected, extension) = FileFormat::detect(path)?;
            if detected != format {
                return Err(SpateError::Source {
                    path: path.display().to_string(),
                    message: format!("folder holds {detected} files, not {format}"),
                });
            }
            extension
        };
        self.register_detected(name, path, format, &extension).await
    }

    async fn register_detected(
        &self,
        name: &str,
        path: &Path,
        format: FileFormat,
        extension: &str,
    ) -> Result<()> {
        let table = table_reference(name)?;
        let shown = path.display().to_string();
        let location = path.to_str().ok_or_else(|| SpateError::Source {
            path: shown.clone(),
            message: "path is not valid UTF-8".to_string(),
        })?;
        // DataFusion reads the files whose names end with this suffix.
        let extension = if extension.is_empty() {
            String::new()
        } else {
            format!(".{extension}")
        };
        let result = match format {
            FileFormat::Parquet => {
                let options = ParquetReadOptions::default().file_extension(&extension);
                self.ctx.register_parquet(table, location, options).await
            }
            FileFormat::Csv => {
                let mut options = CsvReadOptions::new()
                    .has_header(true)
                    .file_extension(&extension);
                if extension.eq_ignore_ascii_case(".tsv") {
                    options = options.delimiter(b'\t');
                }
                self.ctx.register_csv(table, location, options).await
            }
            FileFormat::NdJson => {
                let options = JsonReadOptions::default().file_extension(&extension);
                self.ctx.register_json(table, location, options).await
            }
            FileFormat::ArrowIpc => {
                let options = ArrowReadOptions {
                    file_extension: &extension,
                    ..Default::default()
                };
                self.ctx.register_arrow(table, location, options).await
            }
        };
        result.map_err(|e| match SpateError::source_read(&shown, e) {
            SpateError::Source { path, message } => SpateError::Source {
                path,
                message: format!("{message} (is it a valid {format} file?)"),
            },
            other => other,
        })
    }

    /// Registers in-memory batches as a table. All batches must share one schema; use
    /// [`Engine::register_partitions`] for an empty table or to control partitioning.
    pub fn register_batches(&self, name: &str, batches: Vec<RecordBatch>) -> Result<()> {
        let schema =
            batches
                .first()
                .map(RecordBatch::schema)
                .ok_or_else(|| SpateError::Config {
                    message: format!(
                        "table '{name}': no batches given, so its schema is unknown; \
                     use register_partitions with a schema for an empty table"
                    ),
                })?;
        self.register_partitions(name, schema, vec![batches])
    }

    /// Registers in-memory batches, one inner vector per partition, with an explicit schema.
    pub fn register_partitions(
        &self,
        name: &str,
        schema: SchemaRef,
        partitions: Vec<Vec<RecordBatch>>,
    ) -> Result<()> {
        let table = table_reference(name)?;
        let provider = MemTable::try_new(schema, partitions).map_err(|e| SpateError::Config {
            message: format!("table '{name}': {}", SpateError::from(e)),
        })?;
        self.ctx.register_table(table, Arc::new(provider))?;
        Ok(())
    }

    /// Registers a DataFrame's plan as the view `name`: queries that read it run the plan.
    pub fn register_view(&self, name: &str, df: DataFrame) -> Result<()> {
        let table = table_reference(name)?;
        self.ctx.register_table(table, df.into_view())?;
        Ok(())
    }

    /// Removes a table; returns whether it existed.
    pub fn deregister(&self, name: &str) -> Result<bool> {
        let existed = self.ctx.deregister_table(table_reference(name)?)?.is_some();
        // The cached data went with the provider; its entry must not outlive it.
        self.lock_cached().remove(&normalized_name(name)?);
        Ok(existed)
    }

    /// Splits SQL text into statements, in the session's dialect.
    pub fn parse(&self, sql: &str) -> Result<Vec<Statement>> {
        let state = self.ctx.state();
        let options = &state.config().options().sql_parser;
        let dialect = dialect_from_str(options.dialect.as_ref()).ok_or_else(|| {
            config_error(&format!("unsupported SQL dialect '{}'", options.dialect))
        })?;
        let rewritten = crate::rewrite::rewrite(sql, dialect.as_ref())?;
        let sql: &str = &rewritten;
        let statements = DFParserBuilder::new(sql)
            .with_dialect(dialect.as_ref())
            .with_recursion_limit(options.recursion_limit.get())
            .build()
            .and_then(|mut parser| parser.parse_statements())
            .map_err(|e| locate_end_of_input(SpateError::from(e), sql))?;
        Ok(statements.into())
    }

    /// Plans one parsed statement and returns it as a lazy DataFrame. DDL and `SET` take effect
    /// here.
    pub async fn execute_statement(&self, statement: Statement) -> Result<DataFrame> {
        if let Statement::Statement(sql) = &statement {
            if let Some(df) = self.streams.execute(sql).await? {
                return Ok(df);
            }
            match sql.as_ref() {
                SqlStatement::Cache {
                    table_name,
                    query,
                    options,
                    ..
                } => {
                    if query.is_some() {
                        return Err(SpateError::Unsupported {
                            message: "CACHE TABLE … AS SELECT is not supported; run CREATE \
                                      TABLE name AS SELECT …, then CACHE TABLE name"
                                .into(),
                        });
                    }
                    let columns = sharded_by_option(options)?;
                    let cached = self
                        .cache_table_sharded_by(&table_name.to_string(), &columns)
                        .await?;
                    return self.cache_report(&[cached]);
                }
                SqlStatement::UNCache {
                    table_name,
                    if_exists,
                } => {
                    let name = table_name.to_string();
                    let freed = match self.uncache_table(&name) {
                        Ok(t) => vec![t],
                        Err(SpateError::Config { .. }) if *if_exists => Vec::new(),
                        Err(e) => return Err(e),
                    };
                    return self.cache_report(&freed);
                }
                _ => {}
            }
        }
        if let Some(gpu) = &self.gpu
            && matches!(&statement, Statement::Explain(e) if e.options.analyze)
        {
            // EXPLAIN ANALYZE reports each GPU operator's roofline floor at the measured
            // bandwidth; measure it before the query runs (once per session).
            gpu.measure_bandwidth()?;
        }
        let plan = self.ctx.state().statement_to_plan(statement).await?;
        self.execute_plan(plan).await
    }

    /// `EXPLAIN` for a DataFrame built through the API rather than SQL: the same output as the
    /// SQL statement, including where each operator runs on a GPU backend.
    pub async fn explain(&self, df: DataFrame, verbose: bool, analyze: bool) -> Result<DataFrame> {
        if analyze && let Some(gpu) = &self.gpu {
            gpu.measure_bandwidth()?;
        }
        let plan = df.explain(verbose, analyze)?.into_unoptimized_plan();
        self.execute_plan(plan).await
    }

    /// Runs DDL or turns a query plan into a lazy DataFrame, annotating plain `EXPLAIN` with
    /// operator placement on GPU backends.
    async fn execute_plan(&self, plan: LogicalPlan) -> Result<DataFrame> {
        if self.gpu.is_some()
            && let LogicalPlan::Explain(explain) = &plan
            && !explain.verbose
            && matches!(explain.explain_format, ExplainFormat::Indent)
        {
            return self.explain_with_placement(explain).await;
        }
        // DDL that drops or replaces a table also ends its cache: the cached provider is the
        // one that goes.
        let replaced = match &plan {
            LogicalPlan::Ddl(ddl) => match ddl {
                DdlStatement::DropTable(drop) => Some(drop.name.table().to_string()),
                DdlStatement::DropView(drop) => Some(drop.name.table().to_string()),
                DdlStatement::CreateMemoryTable(create) => Some(create.name.table().to_string()),
                DdlStatement::CreateView(create) => Some(create.name.table().to_string()),
                DdlStatement::CreateExternalTable(create) => Some(create.name.table().to_string()),
                _ => None,
            },
            _ => None,
        };
        let df = self.ctx.execute_logical_plan(plan).await?;
        if let Some(name) = replaced {
            self.lock_cached().remove(&name);
        }
        Ok(df)
    }

    /// Loads table `name` into memory for later queries: GPU memory on a GPU backend, host
    /// memory on `cpu` (see [`crate::cache`]). Caching a cached table again changes nothing.
    /// With several devices the rows are sharded over them round robin.
    pub async fn cache_table(&self, name: &str) -> Result<CachedTable> {
        self.cache_table_sharded_by(name, &[]).await
    }

    /// [`Engine::cache_table`], with several devices sharding the rows by the hash of
    /// `columns` (`CACHE TABLE name SHARDED BY (columns)`): a join or an aggregation by them
    /// then needs no exchange between devices. Empty `columns` shard round robin.
    pub async fn cache_table_sharded_by(
        &self,
        name: &str,
        columns: &[String],
    ) -> Result<CachedTable> {
        if let Some(url) = self.remote() {
            return Err(SpateError::Unsupported {
                message: format!(
                    "CACHE TABLE {name} in a remote session: the executors of {url} run the \
                     queries, over the table's files"
                ),
            });
        }
        let key = normalized_name(name)?;
        let reference = table_reference(name)?;
        let original = self.ctx.table_provider(reference.clone()).await?;
        if original_provider(original.as_ref()).is_some() {
            if let Some(cached) = self.lock_cached().get(&key) {
                return Ok(cached.clone());
            }
        } else {
            // A table registered since under this name (by an embedder, say) ended the cache.
            self.lock_cached().remove(&key);
        }
        let schema = original.schema();
        let shard_columns = columns
            .iter()
            .map(|c| {
                let wanted = c.trim_matches('"');
                let fields = schema.fields();
                fields
                    .iter()
                    .position(|f| f.name() == wanted)
                    .or_else(|| {
                        fields
                            .iter()
                            .position(|f| f.name().eq_ignore_ascii_case(wanted))
                    })
                    .ok_or_else(|| SpateError::Sql {
                        message: format!(
                            "CACHE TABLE {name} SHARDED BY: no column '{wanted}' in the table"
                        ),
                        location: None,
                    })
            })
            .collect::<Result<Vec<usize>>>()?;
        let partitions = self
            .ctx
            .read_table(Arc::clone(&original))?
            .collect_partitioned()
            .await?;
        let (provider, cached): (Arc<dyn datafusion::datasource::TableProvider>, CachedTable) =
            match &self.gpu {
                Some(gpu) => {
                    let batch_bytes =
                        SpateOptions::gpu_batch_bytes(self.ctx.state().config().options());
                    let loader = Arc::clone(gpu);
                    let by = shard_columns.clone();
                    let table = tokio::task::spawn_blocking(move || {
                        crate::exec::cache::DeviceTable::load(
                            &loader,
                            schema,
                            partitions,
                            batch_bytes,
                            by,
                        )
                    })
                    .await
                    .map_err(|e| SpateError::Internal {
                        message: format!("caching table '{name}' stopped: {e}"),
                    })??;
                    let several = gpu.devices().len() > 1;
                    let cached = CachedTable {
                        name: key.clone(),
                        rows: table.num_rows(),
                        bytes: table.device_bytes(),
                        location: CacheLocation::Gpu,
                        shards: if several {
                            table
                                .shards()
                                .into_iter()
                                .zip(gpu.devices())
                                .map(|((rows, bytes), d)| crate::cache::Shard {
                                    device: d.ordinal(),
                                    rows,
                                    bytes,
                                })
                                .collect()
                        } else {
                            Vec::new()
                        },
                        sharded_by: if several {
                            shard_columns
                                .iter()
                                .map(|&c| table.schema().field(c).name().clone())
                                .collect()
                        } else {
                            Vec::new()
                        },
                    };
                    let table = Arc::new(table);
                    let spillable: std::sync::Weak<dyn crate::exec::coordinator::Spillable> =
                        Arc::downgrade(&table) as _;
                    gpu.register_spillable(spillable);
                    let provider =
                        crate::exec::cache::CachedTableProvider::new(table, Arc::clone(&original));
                    (Arc::new(provider), cached)
                }
                None => {
                    let bytes: usize = partitions
                        .iter()
                        .flatten()
                        .map(RecordBatch::get_array_memory_size)
                        .sum();
                    let rows = partitions.iter().flatten().map(RecordBatch::num_rows).sum();
                    let reservation = datafusion::execution::memory_pool::MemoryConsumer::new(
                        format!("cached table {key}"),
                    )
                    .register(&self.ctx.runtime_env().memory_pool);
                    reservation.try_grow(bytes)?;
                    let table = MemTable::try_new(schema, partitions)?;
                    let provider =
                        HostCachedTableProvider::new(table, Arc::clone(&original), reservation);
                    let cached = CachedTable {
                        name: key.clone(),
                        rows,
                        bytes,
                        location: CacheLocation::Host,
                        shards: Vec::new(),
                        sharded_by: Vec::new(),
                    };
                    (Arc::new(provider), cached)
                }
            };
        self.ctx.deregister_table(reference.clone())?;
        self.ctx.register_table(reference, provider)?;
        self.lock_cached().insert(key, cached.clone());
        Ok(cached)
    }

    /// Drops table `name` from the cache: later queries read its source again, and the memory
    /// is freed once no running query holds it. Fails when the table is not cached.
    pub fn uncache_table(&self, name: &str) -> Result<CachedTable> {
        let key = normalized_name(name)?;
        let Some(cached) = self.lock_cached().remove(&key) else {
            return Err(SpateError::Config {
                message: format!("table '{name}' is not cached (CACHE TABLE {name} caches it)"),
            });
        };
        let reference = table_reference(name)?;
        // Only put the original back if the cached provider is still the one registered (the
        // table may have been dropped or replaced since).
        let current = self.ctx.deregister_table(reference.clone())?;
        match current.as_deref().and_then(original_provider) {
            Some(original) => {
                self.ctx.register_table(reference, original)?;
            }
            None => {
                if let Some(other) = current {
                    self.ctx.register_table(reference, other)?;
                }
            }
        }
        Ok(cached)
    }

    /// The session config a plan made elsewhere (a Ballista stage) runs under on this
    /// engine's GPU: `base` with the GPU context and Spate's options, GPU regions keeping the
    /// partitions they were planned with (a stage's tasks each run their own). `None` without
    /// a GPU.
    pub fn stage_config(&self, base: SessionConfig) -> Option<SessionConfig> {
        let gpu = self.gpu.as_ref()?;
        let mut options = SpateOptions::default();
        options.gpu.one_partition = false;
        Some(
            base.with_extension(Arc::clone(gpu))
                .with_option_extension(options),
        )
    }

    /// The physical optimizer rule that places a plan's operators on this engine's GPU (for
    /// plans made elsewhere); `None` without a GPU.
    pub fn offload_rule(&self) -> Option<GpuOffloadRule> {
        self.gpu
            .as_ref()
            .map(|g| GpuOffloadRule::new(Arc::clone(g)))
    }

    /// The tables cached now, sorted by name.
    pub fn cached_tables(&self) -> Vec<CachedTable> {
        let mut tables: Vec<CachedTable> = self.lock_cached().values().cloned().collect();
        tables.sort_by(|a, b| a.name.cmp(&b.name));
        tables
    }

    fn lock_cached(&self) -> std::sync::MutexGuard<'_, HashMap<String, CachedTable>> {
        self.cached.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The result of `CACHE TABLE` / `UNCACHE TABLE`: one row per table.
    fn cache_report(&self, tables: &[CachedTable]) -> Result<DataFrame> {
        use datafusion::arrow::array::UInt64Array;
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let schema = Arc::new(Schema::new(vec![
            Field::new("table", DataType::Utf8, false),
            Field::new("rows", DataType::UInt64, false),
            Field::new("bytes", DataType::UInt64, false),
            Field::new("location", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from_iter_values(
                    tables.iter().map(|t| t.name.as_str()),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    tables.iter().map(|t| t.rows as u64),
                )),
                Arc::new(UInt64Array::from_iter_values(
                    tables.iter().map(|t| t.bytes as u64),
                )),
                Arc::new(StringArray::from_iter_values(
                    tables.iter().map(|t| t.location.to_string()),
                )),
            ],
        )?;
        Ok(self.ctx.read_batch(batch)?)
    }

    /// `EXPLAIN` with a GPU backend: DataFusion's plans, each physical node marked `[GPU]` or
    /// `[CPU: reason]`.
    async fn explain_with_placement(&self, explain: &Explain) -> Result<DataFrame> {
        let state = self.ctx.state();
        let logical = state.optimize(&explain.plan)?;
        let physical = state.create_physical_plan(&explain.plan).await?;
        let plans: ArrayRef = Arc::new(StringArray::from(vec![
            logical.display_indent().to_string(),
            crate::plan::offload::annotate(&physical),
        ]));
        let kinds: ArrayRef = Arc::new(StringArray::from(vec!["logical_plan", "physical_plan"]));
        let schema = Arc::new(explain.schema.as_arrow().clone());
        let batch = RecordBatch::try_new(schema, vec![kinds, plans])?;
        Ok(self.ctx.read_batch(batch)?)
    }

    /// Plans one SQL statement. Text with several statements is an error; use
    /// [`Engine::parse`] and [`Engine::execute_statement`] for scripts.
    pub async fn sql(&self, sql: &str) -> Result<DataFrame> {
        let mut statements = self.parse(sql)?;
        match statements.len() {
            1 => self.execute_statement(statements.remove(0)).await,
            0 => Err(SpateError::Sql {
                message: "no SQL statement given".to_string(),
                location: None,
            }),
            n => Err(SpateError::Sql {
                message: format!(
                    "expected one statement, found {n}; run them one at a time or use \
                     Engine::parse with Engine::execute_statement"
                ),
                location: None,
            }),
        }
    }

    /// Runs one SQL statement and streams its result.
    pub async fn sql_stream(&self, sql: &str) -> Result<SendableRecordBatchStream> {
        Ok(self.sql(sql).await?.execute_stream().await?)
    }

    /// Runs one SQL statement and collects its result.
    pub async fn collect(&self, sql: &str) -> Result<Vec<RecordBatch>> {
        Ok(self.sql(sql).await?.collect().await?)
    }

    /// A writer pushing record batches into stream `name` (`CREATE STREAM`).
    pub fn stream_writer(&self, name: &str) -> Result<StreamWriter> {
        let stream = self.streams.stream(name)?;
        Ok(StreamWriter::new(Arc::clone(&self.streams), stream))
    }

    /// The results of continuous view `name` from now on, as they are emitted.
    pub fn subscribe(&self, name: &str) -> Result<Subscription> {
        Ok(Subscription::new(self.streams.view(name)?.as_ref()))
    }

    /// Writes the state of every stream and continuous view to `folder` (`CHECKPOINT
    /// 'folder'`), after cutting a micro-batch of whatever waits. Returns each stream's
    /// offset: the rows it had taken.
    pub async fn checkpoint(&self, folder: impl AsRef<Path>) -> Result<Vec<CheckpointStream>> {
        self.streams.checkpoint(folder.as_ref()).await
    }

    /// Declares the streams and views of the checkpoint in `folder` and puts their state back
    /// (`RESTORE 'folder'`), in a session that has none of them yet. Writers resume from each
    /// stream's offset.
    pub async fn restore(&self, folder: impl AsRef<Path>) -> Result<Vec<CheckpointStream>> {
        self.streams.restore(folder.as_ref()).await
    }

    /// Tails `folder` into stream `stream`: each new file of `format` (by default the format
    /// of the files there) is read once, in name order, once it has settled, and pushed as one
    /// micro-batch; the folder is looked at every `poll`. See [`FolderTail`].
    pub fn tail_folder(
        &self,
        stream: &str,
        folder: impl AsRef<Path>,
        format: Option<FileFormat>,
        poll: std::time::Duration,
    ) -> Result<FolderTail> {
        let folder = folder.as_ref();
        let format = match format {
            Some(f) => f,
            None => {
                FileFormat::detect(folder)
                    .map_err(|e| SpateError::Config {
                        message: format!(
                            "tailing {}: {e}; name the format of the files to come",
                            folder.display()
                        ),
                    })?
                    .0
            }
        };
        self.streams.tail_folder(stream, folder, format, poll)
    }

    /// Reads lines of CSV (a header row first) or NDJSON from `source` into stream `stream`,
    /// rows handed over as they come, until the source ends; then the feed's writer finishes.
    /// `what` names the source in errors (`"stdin"`). See [`Feed`].
    pub fn feed(
        &self,
        stream: &str,
        source: impl std::io::Read + Send + 'static,
        format: FileFormat,
        what: &str,
    ) -> Result<Feed> {
        self.streams.feed(stream, source, format, what)
    }

    /// Whether the session has a stream named `name` (as a table name is matched).
    pub fn has_stream(&self, name: &str) -> bool {
        self.streams.stream(name).is_ok()
    }

    /// The session's streams: watermark, lag, late rows, what they keep, and their views.
    pub fn streams(&self) -> Vec<StreamInfo> {
        self.streams.infos()
    }

    /// The tables in the current schema, sorted by name.
    pub fn table_names(&self) -> Vec<String> {
        let state = self.ctx.state();
        let options = &state.config().options().catalog;
        let mut names = self
            .ctx
            .catalog(&options.default_catalog)
            .and_then(|c| c.schema(&options.default_schema))
            .map(|s| s.table_names())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The schema of a registered table.
    pub async fn table_schema(&self, name: &str) -> Result<SchemaRef> {
        let table = self.ctx.table_provider(table_reference(name)?).await?;
        Ok(table.schema())
    }
}

/// The key a table is cached under: its name as DataFusion resolves it (unquoted names are
/// lower-cased).
fn normalized_name(name: &str) -> Result<String> {
    Ok(table_reference(name)?.to_string())
}

/// The parser reports no position when input ends too early; point at the end of the input.
fn locate_end_of_input(err: SpateError, sql: &str) -> SpateError {
    match err {
        SpateError::Sql {
            message,
            location: None,
        } if message.ends_with("found: EOF") => {
            let trimmed = sql.trim_end();
            let line = trimmed.lines().count().max(1);
            let column = trimmed.lines().last().map_or(0, |l| l.chars().count()) + 1;
            SpateError::Sql {
                message,
                location: Some(Location {
                    line: line as u64,
                    column: column as u64,
                }),
            }
        }
        other => other,
    }
}

/// Validates a table name and turns it into a reference.
///
/// Names are plain SQL identifiers. They are stored lowercased because SQL folds unquoted
/// identifiers to lower case: a table registered as `LineItem` is then found by
/// `SELECT * FROM LineItem`.
fn table_reference(name: &str) -> Result<TableReference> {
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(config_error(&format!(
            "invalid table name '{name}': use letters, digits and underscores, starting with a \
             letter or underscore"
        )));
    }
    Ok(TableReference::bare(name.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn cpu() -> Engine {
        Engine::builder().backend(Backend::Cpu).build().unwrap()
    }

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])),
            ],
        )
        .unwrap()
    }

    #[tokio::test]
    async fn in_memory_batches_are_queryable() {
        let engine = cpu();
        engine.register_batches("T", vec![batch()]).unwrap();
        assert_eq!(engine.table_names(), vec!["t".to_string()]);
        let out = engine
            .collect("SELECT count(name) AS n FROM t WHERE id > 1")
            .await
            .unwrap();
        let n = out[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(n.value(0), 1);
        assert_eq!(engine.table_schema("t").await.unwrap().fields().len(), 2);
        assert!(engine.deregister("t").unwrap());
        assert!(!engine.deregister("t").unwrap());
    }

    #[tokio::test]
    async fn empty_tables_need_a_schema() {
        let engine = cpu();
        assert!(engine.register_batches("e", vec![]).is_err());
        engine
            .register_partitions("e", batch().schema(), vec![vec![]])
            .unwrap();
        let out = engine.collect("SELECT * FROM e").await.unwrap();
        assert_eq!(out.iter().map(RecordBatch::num_rows).sum::<usize>(), 0);
    }

    #[tokio::test]
    async fn bad_sql_is_a_user_error_with_location() {
        let engine = cpu();
        let err = engine.sql("SELECT 1 FROM").await.unwrap_err();
        assert!(matches!(err, SpateError::Sql { .. }), "{err:?}");
        assert!(err.location().is_some(), "{err:?}");

        let err = engine
            .sql("SELECT nope FROM (SELECT 1 AS a)")
            .await
            .unwrap_err();
        assert!(err.is_user_error());
        assert!(err.to_string().contains("nope"), "{err}");

        let err = engine.sql("SELECT 1; SELECT 2").await.unwrap_err();
        assert!(err.to_string().contains("found 2"), "{err}");
        assert!(engine.sql("  ").await.is_err());
    }

    #[tokio::test]
    async fn scripts_run_statement_by_statement() {
        let engine = cpu();
        let statements = engine
            .parse("CREATE TABLE x AS VALUES (1), (2); SELECT sum(column1) FROM x;")
            .unwrap();
        assert_eq!(statements.len(), 2);
        let mut last = Vec::new();
        for s in statements {
            last = engine
                .execute_statement(s)
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
        }
        let sum = last[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(sum.value(0), 3);
    }

    #[tokio::test]
    async fn dynamic_filters_stay_on_for_the_cpu_operators_of_gpu_sessions() {
        let dynamic = |engine: &Engine| {
            engine
                .context()
                .state()
                .config()
                .options()
                .optimizer
                .enable_dynamic_filter_pushdown
        };
        let cpu = Engine::builder().backend(Backend::Cpu).build().unwrap();
        let gpu = Engine::builder()
            .backend(Backend::Emulated)
            .build()
            .unwrap();
        assert!(dynamic(&cpu) && dynamic(&gpu));
        let off = Engine::builder()
            .backend(Backend::Emulated)
            .option(
                "datafusion.optimizer.enable_dynamic_filter_pushdown",
                "false",
            )
            .build()
            .unwrap();
        assert!(!dynamic(&off));
        // A TopK over a GPU subtree: the filter its CPU sort would publish cannot cross the
        // GPU operators below it, and the answer is the CPU's.
        let sql = "SELECT v FROM (SELECT value * 2 AS v FROM generate_series(1, 5000)) \
                   WHERE v % 3 = 0 ORDER BY v DESC LIMIT 3";
        for engine in [&cpu, &gpu] {
            let batches = engine.collect(sql).await.unwrap();
            let v = batches[0]
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            assert_eq!(v.values(), &[9996, 9990, 9984]);
        }
    }

    #[tokio::test]
    async fn settings_are_validated() {
        assert!(Engine::builder().target_partitions(0).build().is_err());
        assert!(Engine::builder().batch_size(0).build().is_err());
        let err = Engine::builder()
            .backend(Backend::Cpu)
            .option("datafusion.no.such.key", "1")
            .build()
            .unwrap_err();
        assert!(matches!(err, SpateError::Config { .. }), "{err:?}");
        let engine = Engine::builder()
            .backend(Backend::Cpu)
            .target_partitions(3)
            .batch_size(1024)
            .memory_limit(64 << 20)
            .option("datafusion.execution.coalesce_batches", "false")
            .build()
            .unwrap();
        let options = Arc::clone(engine.context().state().config().options());
        assert_eq!(options.execution.target_partitions, 3);
        assert_eq!(options.execution.batch_size.get(), 1024);
        assert!(!options.execution.coalesce_batches);
    }

    #[tokio::test]
    async fn files_register_by_extension_and_fail_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("people.csv");
        std::fs::write(&csv, "id,name\n1,ann\n2,bob\n").unwrap();
        let json = dir.path().join("people.ndjson");
        std::fs::write(&json, "{\"id\": 1}\n{\"id\": 5}\n").unwrap();
        let engine = cpu();
        engine.register("people", &csv).await.unwrap();
        engine.register_ndjson("events", &json).await.unwrap();
        let out = engine
            .collect("SELECT sum(id) FROM people UNION ALL SELECT sum(id) FROM events")
            .await
            .unwrap();
        assert_eq!(out.iter().map(RecordBatch::num_rows).sum::<usize>(), 2);

        let err = engine
            .register("x", dir.path().join("missing.parquet"))
            .await;
        let err = err.unwrap_err().to_string();
        assert!(
            err.contains("missing.parquet") && err.contains("no such file"),
            "{err}"
        );

        let corrupt = dir.path().join("corrupt.parquet");
        std::fs::write(&corrupt, b"definitely not parquet").unwrap();
        let err = engine.register("c", &corrupt).await.unwrap_err();
        assert!(matches!(err, SpateError::Source { .. }), "{err:?}");
        assert!(err.to_string().contains("corrupt.parquet"), "{err}");

        // An explicit format reads a file whatever its extension.
        let odd = dir.path().join("people.data");
        std::fs::copy(&csv, &odd).unwrap();
        engine.register_csv("people2", &odd).await.unwrap();
        let out = engine
            .collect("SELECT count(*) FROM people2")
            .await
            .unwrap();
        assert_eq!(out[0].num_rows(), 1);
        let csv_dir = dir.path().join("csvs");
        std::fs::create_dir(&csv_dir).unwrap();
        std::fs::copy(&csv, csv_dir.join("part-0.csv")).unwrap();
        let err = engine.register_parquet("p", &csv_dir).await.unwrap_err();
        assert!(err.to_string().contains("not Parquet"), "{err}");

        let err = engine.register("bad name", &csv).await.unwrap_err();
        assert!(err.to_string().contains("invalid table name"), "{err}");
    }
}
