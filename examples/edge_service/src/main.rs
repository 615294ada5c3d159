//! The edge service's binary: everything is in the library (`edge_service::main`), which the
//! integration tests also drive in-process.

fn main() -> std::process::ExitCode {
    edge_service::main()
}
