//! `etcdadm-controller`: the EtcdadmCluster controller binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use etcdadm_shared::manager::{Manager, ManagerArgs};
use etcdadm_shared::store::{HostRule, StorePolicy};

const DEFAULT_LEADER_ELECTION_ID: &str = "etcdadm-controller-manager-leader-election";

#[derive(Parser)]
#[command(
    name = "etcdadm-controller",
    version,
    about = "Cluster API controller for external etcd clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the EtcdadmCluster and snapshot controllers (and the admission webhooks) against the
    /// cluster from the kubeconfig or the in-cluster config.
    Run(Box<RunArgs>),
    /// Print the CRDs this provider serves, or write them into a directory.
    Crd {
        /// Write one `<group>_<plural>.yaml` per CRD here instead of printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

/// The manager's flags and this binary's own.
#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    manager: ManagerArgs,
    /// Snapshots taken at once across all clusters; each holds up to 10 MiB of upload buffers.
    /// A cluster whose snapshot is due waits for a free slot.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    max_concurrent_snapshots: u16,
    /// Object stores are reached only at these hosts (comma-separated addresses, ranges like
    /// 10.0.0.0/8, host names, or `.example.com` for names under it; default: any host not
    /// refused). A name is also checked by the addresses it resolves to.
    #[arg(long, value_delimiter = ',', value_parser = HostRule::parse)]
    store_allowed_hosts: Vec<HostRule>,
    /// Object stores are never reached at these hosts (same forms), e.g. the cluster's Service
    /// and Pod ranges. Link-local and metadata addresses are refused without being listed.
    #[arg(long, value_delimiter = ',', value_parser = HostRule::parse)]
    store_denied_hosts: Vec<HostRule>,
    /// Whether a tenant's plain http store (`insecure: true`) may be used at all.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    store_allow_insecure: bool,
    /// Where restore drills (`spec.backup.verify`) find etcd and etcdutl (or etcdctl for etcd
    /// 3.4); default: PATH.
    #[arg(long)]
    drill_etcd_dir: Option<PathBuf>,
    /// Where restore drills download a snapshot and restore it (room for twice the largest
    /// snapshot drilled); default: the system's temporary directory.
    #[arg(long)]
    drill_scratch_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run(args) => {
            let RunArgs {
                manager,
                max_concurrent_snapshots,
                store_allowed_hosts,
                store_denied_hosts,
                store_allow_insecure,
                drill_etcd_dir,
                drill_scratch_dir,
            } = *args;
            let policy = StorePolicy {
                allowed: store_allowed_hosts,
                denied: store_denied_hosts,
                deny_insecure: !store_allow_insecure,
            };
            if let Err(e) = StorePolicy::install(policy) {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
            let manager = Manager::new(manager, "etcdadm-controller", DEFAULT_LEADER_ELECTION_ID)
                .webhooks(etcdadm_etcdcluster::webhook::routes());
            // One pool of snapshot slots: snapshots and restore checksums share it.
            let pool =
                etcdadm_etcdcluster::snapshot::SnapshotPool::new(usize::from(max_concurrent_snapshots));
            let drills = etcdadm_etcdcluster::snapshot::DrillSettings {
                etcd_dir: drill_etcd_dir,
                scratch: drill_scratch_dir.unwrap_or_else(std::env::temp_dir),
                store_deadline: etcdadm_shared::store::limits::REQUEST_DEADLINE,
            };
            manager.main(move |ctx| async move {
                futures::join!(
                    etcdadm_etcdcluster::controller::run(ctx.clone(), pool.clone()),
                    etcdadm_etcdcluster::snapshot::run(ctx, pool, drills),
                );
            })
        }
        Command::Crd { out_dir } => {
            match etcdadm_shared::crd::emit(&etcdadm_etcdcluster::crds(), out_dir.as_deref()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
