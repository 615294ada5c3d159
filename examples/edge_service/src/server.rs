//! Serving: slow-client limits and the request deadline, the HTTP/1.1 server with its graceful
//! shutdown on SIGTERM or ctrl-c, and the start-up (bind, open, dispatcher) of [`run`].

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use idem::http::problem_response;

use crate::*;

/// Slow-client limits and the shutdown grace period.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// A client must send a request's complete headers within this time once the connection
    /// waits for a request (a new connection, or an idle keep-alive one), or the connection is
    /// closed (hyper's `header_read_timeout`; `axum::serve` gives hyper no timer, so it is off
    /// there).
    pub header: Duration,
    /// The whole body must arrive within this time after the headers; a body still incomplete
    /// then fails, and the layer answers 400 (tower-http's `RequestBodyDeadlineLayer`: a
    /// deadline on the whole transfer, so a client trickling one byte at a time is cut off too).
    pub body: Duration,
    /// The whole request (body, store, handler) gets this long before the service answers 503
    /// + `Retry-After` ([`with_timeouts`]).
    pub request: Duration,
    /// On SIGTERM / ctrl-c: how long requests in flight may take to finish before they are
    /// cut off ([`serve`]).
    pub grace: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: Duration::from_secs(10),
            body: Duration::from_secs(10),
            request: Duration::from_secs(30),
            grace: Duration::from_secs(10),
        }
    }
}

/// `app` with the body deadline and the overall request timeout of `timeouts`.
pub fn with_timeouts(app: Router, timeouts: &Timeouts) -> Router {
    // `Router::layer` covers every route and the fallbacks; the last layer added is the
    // outermost. The body deadline starts when the request enters it, right after its headers.
    app.layer(tower_http::timeout::RequestBodyDeadlineLayer::new(
        timeouts.body,
    ))
    .layer(axum::middleware::from_fn_with_state(
        timeouts.request,
        request_deadline,
    ))
}

/// Answers 503 + `Retry-After` when the request takes longer than `limit`.
///
/// This only stops *waiting*: it does not cancel a payment that already started. The
/// Idempotency-Key layer runs the handler in a task of its own once it claimed the key, so a
/// started handler finishes and its answer is recorded after this timeout answered. The detail
/// says so: a retry with the same key gets that answer (or 409 while it is still running), and
/// never books a second payment.
pub(crate) async fn request_deadline(
    State(limit): State<Duration>,
    req: Request,
    next: Next,
) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => {
            let mut resp = problem_response(
                StatusCode::SERVICE_UNAVAILABLE,
                problem::TIMEOUT,
                "Request timed out",
                &format!(
                    "no answer within {} ms; a payment that had started still completes: \
                     retry with the same Idempotency-Key to get its answer",
                    limit.as_millis()
                ),
            );
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(1u64));
            resp
        }
    }
}

/// How [`serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Every request in flight finished within the grace period.
    Drained,
    /// The grace period ran out: this many connections were still open and were cut off.
    GraceExpired {
        /// Connections cut off.
        open: usize,
    },
}

/// Serves `app` on `listener` over HTTP/1.1 until `shutdown` completes, with hyper's header
/// read timeout ([`Timeouts::header`]). Then it stops accepting, lets requests in flight finish
/// for at most [`Timeouts::grace`], and cuts off what is still open.
///
/// A cut-off request's handler, if the layer already started it, is not rolled back by this: its
/// writes and answer commit together or not at all (the runtime drops it at its next await
/// point), and the key's lease lapses if nothing was recorded.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    timeouts: &Timeouts,
    shutdown: impl Future<Output = ()>,
) -> Stopped {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(timeouts.header);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // E.g. out of file descriptors: wait a little rather than spin.
                    eprintln!("edge_service: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        connections.spawn(async move {
            // A connection error (client gone, header timeout) concerns that client only.
            let _ = conn.await;
        });
    }
    drop(listener); // stop accepting: new connections are refused from here on
    while connections.try_join_next().is_some() {}
    match tokio::time::timeout(timeouts.grace, graceful.shutdown()).await {
        Ok(()) => Stopped::Drained,
        Err(_) => {
            while connections.try_join_next().is_some() {}
            let open = connections.len();
            connections.shutdown().await; // aborts them and waits until they are dropped
            Stopped::GraceExpired { open }
        }
    }
}

/// Registers the SIGTERM and ctrl-c (SIGINT) handlers now and returns the future that resolves
/// on the first of them. Called before the service prints that it listens, so a signal sent right
/// after that line always reaches the graceful shutdown (never the default "die at once").
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let interrupt = signal(SignalKind::interrupt());
        async move {
            match (term, interrupt) {
                (Ok(mut term), Ok(mut interrupt)) => {
                    tokio::select! {
                        _ = term.recv() => {},
                        _ = interrupt.recv() => {},
                    }
                }
                (Ok(mut only), Err(_)) | (Err(_), Ok(mut only)) => {
                    only.recv().await;
                }
                (Err(_), Err(_)) => std::future::pending::<()>().await,
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// What to tell an operator whose `--listen` address cannot be bound.
pub(crate) fn bind_error(addr: SocketAddr, e: &std::io::Error) -> String {
    let host = match addr {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => format!("[{}]", a.ip()),
    };
    match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "{addr} is in use (another process listens there): pass --listen {host}:PORT with a \
             free port, or stop that process"
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "not allowed to listen on {addr} (ports below 1024 need privileges): pass --listen \
             {host}:PORT with a port from 1024 up"
        ),
        std::io::ErrorKind::AddrNotAvailable => format!(
            "{addr} is not an address of this machine: pass --listen with one of its addresses, \
             e.g. --listen 127.0.0.1:{}",
            addr.port()
        ),
        _ => format!("cannot listen on {addr}: {e}; pass --listen with another address"),
    }
}

pub(crate) async fn run(args: Args, telemetry: Telemetry) -> Result<Stopped, String> {
    // Bind first: a busy port is the commonest start-up failure, and it should not leave a
    // store file behind in a directory the operator did not mean to use.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| bind_error(args.listen, &e))?;
    let lease = Duration::from_millis(args.lease_ms);
    match args.postgres.clone() {
        None => {
            let store = open_store(&args.data, lease)
                .map_err(|e| format!("cannot open the store in {}: {e}", args.data.display()))?;
            let what = format!("store {}", args.data.join("idem.redb").display());
            serve_on(args, listener, store, what, telemetry).await
        }
        #[cfg(feature = "postgres")]
        Some(url) => {
            let schema = args.pg_schema.clone();
            let opened = tokio::task::spawn_blocking(move || {
                pg::open_store(&url, &schema, lease).map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
            let store = opened.map_err(|e| format!("cannot open the PostgreSQL store: {e}"))?;
            let what = format!("PostgreSQL schema {}", args.pg_schema);
            serve_on(args, listener, store, what, telemetry).await
        }
        #[cfg(not(feature = "postgres"))]
        Some(_) => Err(
            "this build has no PostgreSQL engine: build the service with \
             --features postgres (cargo run -p edge-service --features postgres)"
                .into(),
        ),
    }
}

/// Serves the service on `store` until SIGTERM or ctrl-c, with its dispatcher.
pub(crate) async fn serve_on<E: Engine>(
    args: Args,
    listener: tokio::net::TcpListener,
    store: E,
    what: String,
    telemetry: Telemetry,
) -> Result<Stopped, String>
where
    for<'t> TxOf<'t, E>: Books,
{
    let delivered = Delivered::default();
    let dispatcher = {
        let (store, delivered) = (store.clone(), delivered.clone());
        tokio::task::spawn_blocking(move || start_dispatcher(&store, delivered))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot start the outbox dispatcher: {e}"))?
    };
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    let signal = shutdown_signal();
    eprintln!("edge_service: listening on http://{addr} ({what})");
    let watcher = tokio::spawn(log_store_failure(
        store.clone(),
        std::time::Duration::from_millis(250),
    ));
    let timeouts = args.timeouts();
    telemetry.spawn_upkeep();
    let service = app(store.clone(), delivered).merge(telemetry.routes());
    let router = with_timeouts(service, &timeouts);
    let stopped = serve(listener, router, &timeouts, async {
        signal.await;
        eprintln!(
            "edge_service: shutting down (finishing requests in flight, at most {} ms)",
            timeouts.grace.as_millis()
        );
    })
    .await;
    watcher.abort();
    // Stops after the publish in progress; undelivered events wait for the next start.
    match tokio::task::spawn_blocking(move || dispatcher.shutdown()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("edge_service: outbox dispatcher: {e}"),
        Err(e) => eprintln!("edge_service: outbox dispatcher: {e}"),
    }
    // Closed on the blocking pool: closing may block (the file store's final fsync).
    let _ = tokio::task::spawn_blocking(move || drop(store)).await;
    Ok(stopped)
}
