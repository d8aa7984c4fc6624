//! The worker client's shell command (`client/`, `quota-arbiter-client
//! reserve`), built with the service's tests from its dev-dependency so that
//! the README's and the book's shell examples run it beside the service
//! binary (tests/it/readme.rs puts both on PATH). The service itself links
//! none of the client.

fn main() -> std::process::ExitCode {
    quota_arbiter_client::command::main()
}
