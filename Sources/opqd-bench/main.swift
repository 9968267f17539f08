// opqd-bench: a small dispatcher of benchmark subcommands.
//
//   opqd-bench engine [--quick]      engine vs Foundation.OperationQueue (EngineBench.swift)
//
// Hidden subcommands used by `engine` to run each measurement in a fresh process:
//   opqd-bench engine-mem engine|foundation [--quick]
//   opqd-bench engine-run engine|foundation flat|chain|fanin|chain-suspended|fanin-suspended N
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

let usage = """
usage: opqd-bench <subcommand> [options]

subcommands:
  engine [--quick]   engine vs Foundation.OperationQueue: throughput (flat, chain, fan-in),
                     memory per queued operation, and linearity; last line is one JSON object.
                     --quick divides every size by 10 (smoke tests).
"""

var args = Array(CommandLine.arguments.dropFirst())
let command = args.isEmpty ? "" : args.removeFirst()
switch command {
case "engine":
    exit(EngineBench.main(args))
case "engine-mem":
    exit(EngineBench.memChild(args))
case "engine-run":
    exit(EngineBench.runChild(args))
case "-h", "--help", "help":
    print(usage)
    exit(0)
default:
    if !command.isEmpty { eprint("opqd-bench: unknown subcommand '\(command)'\n") }
    eprint(usage + "\n")
    exit(2)
}
