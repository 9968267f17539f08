import Logging
import OpqdApp
import QueueAPI
import QueueCluster

#if canImport(Glibc)
import Glibc
#endif

// A UTF-8 character type, whatever the environment says: libcurl (libidn2) converts a host name
// outside ASCII (`http://bücher.example/`) to its A-label only in a UTF-8 locale, and in the C
// locale every such URL failed with invalid-spec. LC_CTYPE alone: number formatting and the rest
// stay "C". Debian's libc-bin installs C.UTF-8 (/usr/lib/locale/C.utf8), in the runtime image too;
// where it is missing, nothing changes but a warning at start.
let utf8CharacterType = setlocale(LC_CTYPE, "C.UTF-8") != nil

// `opqd healthcheck` is a client of a running server: it parses its own options and exits
// before anything of the server (signal mask, logging, store) is set up.
if CommandLine.arguments.dropFirst().first == "healthcheck" {
    exit(Healthcheck.run(arguments: Array(CommandLine.arguments.dropFirst(2)), environment: ProcessEnvironment.all()))
}
// `opqd archive export|import` is another client of a running server (ArchiveCommand.swift).
if CommandLine.arguments.dropFirst().first == "archive" {
    exit(ArchiveCommand.run(arguments: Array(CommandLine.arguments.dropFirst(2)), environment: ProcessEnvironment.all()))
}

// Block SIGINT/SIGTERM first, so every thread started later (libmicrohttpd's, Dispatch's)
// inherits the mask and the signals reach only the sigwait below.
var signals = sigset_t()
sigemptyset(&signals)
sigaddset(&signals, SIGINT)
sigaddset(&signals, SIGTERM)
// A cluster instance's role change (RoleChange.swift in opqd): raised by the service's own
// threads, handled here on the main thread.
sigaddset(&signals, SIGUSR1)
pthread_sigmask(SIG_BLOCK, &signals, nil)

let arguments = Array(CommandLine.arguments.dropFirst())
if arguments.contains("--help") || arguments.contains("-h") {
    print(OpqdConfiguration.help)
    exit(0)
}

LoggingSystem.bootstrap { label in
    var handler = StreamLogHandler.standardError(label: label)
    handler.logLevel = .trace
    return handler
}

let configuration: OpqdConfiguration
do {
    configuration = try OpqdConfiguration.parse(arguments: arguments, environment: ProcessEnvironment.all())
} catch {
    let message = "opqd: \(error)\n"
    _ = message.withCString { write(2, $0, strlen($0)) }
    exit(2)
}

var logger = Logger(label: "opqd")
logger.logLevel = configuration.logLevel
if !utf8CharacterType {
    logger.warning("the C.UTF-8 locale is missing: http targets whose host name is not ASCII will fail with invalid-spec")
}

// Set by the image before this one when a cluster instance changed role (`execv` below).
let environment = ProcessEnvironment.all()
let handoff = ClusterHandoff.fromEnvironment(environment)
for name in ClusterHandoff.variables { unsetenv(name) }

let app: any OpqdService
do {
    // A cluster instance keeps its identity across restarts (InstanceIdentity); a single
    // instance's id only names it in GET /v1/cluster.
    if let handoff {
        RoleChanges.instanceID = handoff.instanceID
        if let lock = handoff.identityLock {
            // Still this process's lock (the same open file); if not, the id is not ours alone.
            guard InstanceIdentity.retake(lock) else {
                logger.critical("the --data identity lock was not handed over with the role change; stopping rather than share the id")
                exit(1)
            }
            RoleChanges.identityLock = lock
        }
    } else if OpqdConfiguration.isPostgresURL(configuration.store) {
        (RoleChanges.instanceID, RoleChanges.identityLock) = InstanceIdentity.resolve(explicit: configuration.instanceID, data: configuration.data) {
            logger.notice("\($0)")
        }
    } else {
        RoleChanges.instanceID = ClusterHandoff.newInstanceID()
    }
    app = try buildService(configuration: configuration, logger: logger, instanceID: RoleChanges.instanceID, handoff: handoff) { change in
        RoleChanges.request(change)
    }
    try app.start()
} catch let lost as OwnershipLostDuringStart {
    logger.warning("\(lost); starting again as a follower")
    RoleChanges.reexecute(.becomeFollower, socket: handoff?.listenSocket, logger: logger)
    exit(1)
} catch {
    logger.critical("opqd could not start", metadata: ["error": "\(error)"])
    exit(1)
}
// Machine-readable line for scripts and tests that start opqd on port 0.
print("opqd listening on http://\(configuration.host):\(app.port)")
fflush(nil)

var received: Int32 = 0
while true {
    sigwait(&signals, &received)
    if received == SIGUSR1 {
        guard let change = RoleChanges.requested else { continue }
        logger.info("changing role", metadata: ["to": "\(change)"])
        let socket = app.handOver()
        RoleChanges.reexecute(change, socket: socket, logger: logger)
        // execv failed (logged): this image stopped serving, so it ends, and a supervisor
        // (Docker's restart policy, systemd) starts it again.
        exit(1)
    }
    break
}
logger.info("signal received, stopping", metadata: ["signal": "\(received == SIGTERM ? "SIGTERM" : "SIGINT")"])
app.shutdown()
exit(0)
