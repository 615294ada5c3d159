//! The edge service's binary, built in this package so that its tests find it
//! (`CARGO_BIN_EXE_edge-service-under-test`): the same `main` as examples/edge_service's.

fn main() -> std::process::ExitCode {
    edge_service::main()
}
