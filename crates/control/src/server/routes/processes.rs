//! `/v1/nodes/{id}/processes` and `/v1/processes`: what the programs on each node are doing
//! while they run, as their node's agent reports it (the dashboard's and `rackmem top`'s data).
//!
//! Held in memory only: reports are a second old at most when fresh, and worth nothing after a
//! restart. Each node's report replaces its previous one, so the table is bounded by the nodes
//! registered times [`MAX_REPORTED_PROCESSES`].

use crate::api::{ErrorBody, ProcessReports, ProcessView, MAX_REPORTED_PROCESSES};
use crate::auth::Role as AuthRole;
use crate::plane::PlaneError;
use crate::server::authz::{authorized, Target};
use crate::server::error::ApiError;
use crate::server::extract::{ApiJson, Caller, Id};
use crate::server::state::{lock, with_plane, AppState};
use axum::extract::State;
use axum::Json;
use rackmem_proto::ProcessReport;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Reports older than this are left out of `GET /v1/processes`: their agent stopped reporting
/// (it reports every second while a process runs).
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(30);

/// Each node's latest report and when it came.
#[derive(Default)]
pub(crate) struct ProcessTable {
    nodes: HashMap<u64, (Instant, Vec<ProcessReport>)>,
}

/// Replaces a node's processes with what its agent reports now (node tokens for their own node,
/// and admins).
#[utoipa::path(put, path = "/v1/nodes/{id}/processes", tag = "nodes", request_body = ProcessReports,
    params(("id" = u64, Path, description = "Node id")),
    responses(
        (status = 200, body = ProcessReports, description = "What was stored"),
        (status = 422, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ))]
pub(crate) async fn report_processes(
    State(st): State<AppState>,
    Caller(c): Caller,
    Id(id): Id,
    ApiJson(r): ApiJson<ProcessReports>,
) -> Result<Json<ProcessReports>, ApiError> {
    if r.processes.len() > MAX_REPORTED_PROCESSES {
        return Err(PlaneError::Invalid(format!(
            "{} processes reported: at most {MAX_REPORTED_PROCESSES} per node",
            r.processes.len()
        ))
        .into());
    }
    for p in &r.processes {
        p.validate()
            .map_err(|why| PlaneError::Invalid(format!("process {}: {why}", p.pid)))?;
    }
    authorized(&st, c, Target::Node(id), move |p| p.node(id).map(|_| ())).await?;
    lock(&st.processes)
        .nodes
        .insert(id, (Instant::now(), r.processes.clone()));
    Ok(Json(r))
}

/// Every process the nodes' agents reported in the last 30 s, with C-AMAT of the bricks' level
/// and the share of its run it waited on remote memory (admins and `metrics` tokens).
#[utoipa::path(get, path = "/v1/processes", tag = "nodes",
    responses(
        (status = 200, body = Vec<ProcessView>),
        (status = 403, body = ErrorBody),
    ))]
pub(crate) async fn list_processes(
    State(st): State<AppState>,
    Caller(c): Caller,
) -> Result<Json<Vec<ProcessView>>, ApiError> {
    if !matches!(c.role, AuthRole::Admin | AuthRole::Metrics) {
        return Err(PlaneError::Forbidden(format!(
            "{} may not list processes: admins and metrics tokens may",
            c.describe()
        ))
        .into());
    }
    let names: HashMap<u64, String> = with_plane(&st, |p| Ok(p.nodes()))
        .await?
        .into_iter()
        .map(|n| (n.id, n.name))
        .collect();
    let now = Instant::now();
    let mut table = lock(&st.processes);
    // Nodes gone from the plane, and nodes whose agent went quiet, are forgotten here.
    table
        .nodes
        .retain(|node, (at, _)| names.contains_key(node) && now.duration_since(*at) < STALE_AFTER);
    let mut out: Vec<ProcessView> = table
        .nodes
        .iter()
        .flat_map(|(node, (at, procs))| {
            let age_ms = u64::try_from(now.duration_since(*at).as_millis()).unwrap_or(u64::MAX);
            let node_name = names.get(node).cloned().unwrap_or_default();
            procs
                .iter()
                .map(move |r| view(*node, node_name.clone(), age_ms, r.clone()))
        })
        .collect();
    out.sort_by_key(|v| (v.node, v.report.pid));
    Ok(Json(out))
}

fn view(node: u64, node_name: String, age_ms: u64, report: ProcessReport) -> ProcessView {
    let c = rackmem_model::camat::FromCounters {
        page_accesses: 0,
        faults: report.faults,
        fault_mean_s: report.fault_mean_ns() as f64 / 1e9,
        miss_concurrency: report.miss_concurrency,
        wall_s: report.uptime_ms as f64 / 1e3,
    };
    ProcessView {
        node,
        node_name,
        age_ms,
        bricks_camat_ns: c.bricks_camat_s() * 1e9,
        stall_share: c.stall_share(),
        bricks: report.bricks.iter().map(Into::into).collect(),
        report,
    }
}
