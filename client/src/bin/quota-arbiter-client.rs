//! `quota-arbiter-client reserve FLOW …`: the worker client from a shell.

fn main() -> std::process::ExitCode {
    quota_arbiter_client::command::main()
}
