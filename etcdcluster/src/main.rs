//! `etcdadm-controller`: the EtcdadmCluster controller binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Run the EtcdadmCluster controller against the cluster from the kubeconfig or in-cluster config.
    Run {
        /// Watch only this namespace (all namespaces when absent).
        #[arg(long)]
        namespace: Option<String>,
    },
    /// Print the CRDs this provider serves, or write them into a directory.
    Crd {
        /// Write one `<group>_<plural>.yaml` per CRD here instead of printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run { namespace } => match run(namespace) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
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

/// Run the controller until SIGINT or SIGTERM.
fn run(namespace: Option<String>) -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // One process-wide TLS provider (ring) for every client that does not pick its own; an
    // error only means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let client = kube::Client::try_default().await?;
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        };
        etcdadm_etcdcluster::controller::run(client, namespace, shutdown).await;
        Ok(())
    })
}
