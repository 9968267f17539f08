import Grammar
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Everything `opqd` can be told, from flags or `OPQD_*` variables (flags win).
public struct OpqdConfiguration: Sendable {
    public var host = "127.0.0.1"
    public var port = 8080
    /// Where the embedded store (`opqd.sqlite`) lives.
    public var data = "./opqd-data"
    /// HTTP worker threads. `parse` sets the number of cores (the documented default); a
    /// configuration built in code (the tests' live servers) keeps 2.
    public var threads = 2
    public var maxBody = 1 << 20
    public var defaultMaxConcurrent = 4
    public var logLevel: Logger.Level = .info
    /// Events kept in memory for the feed; older cursors get 410.
    public var eventCapacity = 200_000
    /// Seconds finished operations are kept before they are purged.
    public var retain: Double = 86_400
    public var connectionTimeout = 30
    public var connectionLimit = 4096
    /// `sqlite` (durable, under `data`), `memory` (nothing survives a restart) or a
    /// `postgres://` / `postgresql://` URL (PostgresStore).
    public var store = "sqlite"

    /// Whether `--store` names a PostgreSQL database.
    public static func isPostgresURL(_ s: String) -> Bool { s.hasPrefix("postgres://") || s.hasPrefix("postgresql://") }
    /// SQLite's synchronous level: `full` (fsync at every commit) or `normal`.
    public var sync = "full"
    /// When set, every request but `/healthz`, `/readyz` and the dashboard page needs `Authorization: Bearer <token>`.
    public var token: String? = nil
    /// When set (with `token`), this token may make GET/HEAD requests only.
    public var readToken: String? = nil
    /// The URL other instances and clients reach this one by (`GET /v1/cluster`); default
    /// `http://<host>:<port>`.
    public var advertise: String? = nil
    /// With a PostgreSQL store: this instance's identity in the cluster, kept across restarts,
    /// so that a restarted instance takes its partitions back at once. nil: the one kept in
    /// `data` (made on first start), or a fresh one when another process uses that directory.
    public var instanceID: String? = nil
    /// With a PostgreSQL store: seconds a stopping instance keeps relaying requests after it
    /// handed its queues over, before it stops listening (load balancers see its /readyz 503).
    public var shutdownDelay: Double = 1
    /// With a PostgreSQL store: seconds the owner's lease lasts (renewed every third of it);
    /// when the owner stops renewing, another instance takes the queues over after it.
    public var lease: Double = 10
    /// With a PostgreSQL store: queues spread over the instances by partition (each instance
    /// owns some, `PartitionOwner`) rather than one instance owning them all.
    public var partitioned = true
    /// When set, webhook deliveries carry `X-Opqd-Signature: sha256=<hex HMAC-SHA256 of the body>`
    /// keyed with it, so receivers can tell opqd's POSTs from anyone else's. Never logged.
    public var webhookSecret: String? = nil
    /// Seconds one webhook POST may take before it counts as failed.
    public var webhookTimeout: Double = 10
    /// The first retry's delay after a failed delivery (seconds); each next one doubles.
    public var webhookBackoff: Double = 1
    /// The longest delay between retries of a delivery (seconds).
    public var webhookMaxBackoff: Double = 300
    /// Events one observer holds in memory; past it, it reads them back from the store.
    public var webhookBuffer = 256
    /// Every bound on what a client can make the server hold.
    public var limits = APILimits()

    /// Bounds on memory and work a client can cause (`APILimits`).
    public typealias Limits = APILimits
    /// Executables `command` operations may run.
    public var allowCommands: [String] = []

    public init() {}

    /// One option: its flag, variable, help and how it is applied.
    struct Option: Sendable {
        let flag: String
        let env: String
        let help: String
        let apply: @Sendable (inout OpqdConfiguration, String) throws -> Void
    }

    static func level(_ s: String) throws -> Logger.Level {
        guard let l = Logger.Level(rawValue: s.lowercased()) else {
            throw ConfigurationError("--log-level must be one of trace, debug, info, notice, warning, error, critical; got '\(s)'")
        }
        return l
    }

    static func seconds(_ s: String, _ flag: String, _ range: ClosedRange<Double>) throws -> Double {
        switch DecimalNumber.decimal(s, in: range) {
        case let .success(v): return v
        case let .failure(why):
            let what = "a number of seconds from \(plain(range.lowerBound)) to \(plain(range.upperBound))"
            throw ConfigurationError("\(flag) " + why.explained(must: what, writtenAs: DecimalNumber.decimalRule, got: s))
        }
    }

    /// `2` for 2.0, `0.1` for 0.1.
    static func plain(_ v: Double) -> String { v == v.rounded() && abs(v) < 1e15 ? String(Int64(v)) : String(v) }

    static func int(_ s: String, _ flag: String, _ range: ClosedRange<Int>) throws -> Int {
        switch DecimalNumber.integer(s, in: range) {
        case let .success(v): return v
        case let .failure(why):
            let what = "an integer from \(range.lowerBound) to \(range.upperBound)"
            throw ConfigurationError("\(flag) " + why.explained(must: what, writtenAs: DecimalNumber.integerRule, got: s))
        }
    }

    /// A secret (token, webhook key): any bytes, but not none.
    static func secret(_ s: String, _ flag: String) throws -> String {
        guard !s.isEmpty else { throw ConfigurationError("\(flag) must not be empty") }
        return s
    }

    /// 1 to 64 of `A-Z a-z 0-9 . _ -`: an instance's id as `--instance-id` takes it.
    public static func isInstanceID(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard (1...64).contains(bytes.count) else { return false }
        return bytes.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x2E || b == 0x5F || b == 0x2D
        }
    }

    static let options: [Option] = [
        Option(flag: "--advertise", env: "OPQD_ADVERTISE", help: "URL others reach this instance by, shown by GET /v1/cluster (default http://<host>:<port>)") {
            c, v in
            guard v.hasPrefix("http://") || v.hasPrefix("https://"), v.utf8.count <= 512, !v.contains(where: { $0.isWhitespace }) else {
                throw ConfigurationError("--advertise must be an http:// or https:// URL of at most 512 bytes; got '\(v.prefix(100))'")
            }
            c.advertise = v
        },
        Option(
            flag: "--instance-id", env: "OPQD_INSTANCE_ID",
            help:
                "with a postgres:// store, this instance's identity (1-64 of A-Z a-z 0-9 . _ -), kept across restarts so a restarted instance takes its partitions back at once; never give two running instances the same one (default: the one kept in --data)"
        ) { c, v in
            guard isInstanceID(v) else {
                throw ConfigurationError("--instance-id must be 1 to 64 of the characters A-Z a-z 0-9 . _ -; got '\(v.prefix(100))'")
            }
            c.instanceID = v
        },
        Option(
            flag: "--shutdown-delay", env: "OPQD_SHUTDOWN_DELAY",
            help:
                "with a postgres:// store, seconds a stopping instance keeps relaying requests after handing its queues to the others, while load balancers notice its /readyz 503 (0-60, default 1)"
        ) { c, v in c.shutdownDelay = try seconds(v, "--shutdown-delay", 0...60) },
        Option(
            flag: "--lease", env: "OPQD_LEASE",
            help: "with a postgres:// store, seconds an ownership lease lasts; another instance takes an instance's partitions over after it (default 10)"
        ) { c, v in c.lease = try seconds(v, "--lease", 1...300) },
        Option(
            flag: "--ownership", env: "OPQD_OWNERSHIP",
            help:
                "with a postgres:// store: partitions (queues spread over the instances; default) or one (deprecated: one instance owns every queue, the others forward to it)"
        ) { c, v in
            guard v == "one" || v == "partitions" else { throw ConfigurationError("--ownership must be one or partitions; got '\(v.prefix(100))'") }
            c.partitioned = v == "partitions"
        },
        Option(flag: "--host", env: "OPQD_HOST", help: "address to listen on (default 127.0.0.1; 0.0.0.0 for all)") { c, v in c.host = v },
        Option(flag: "--port", env: "OPQD_PORT", help: "TCP port (default 8080; 0 picks a free one)") { c, v in c.port = try int(v, "--port", 0...65535) },
        Option(
            flag: "--data", env: "OPQD_DATA",
            help: "directory of the embedded store; with a postgres:// store, where the instance keeps its identity (default ./opqd-data)"
        ) { c, v in c.data = v },
        Option(
            flag: "--store", env: "OPQD_STORE",
            help:
                "sqlite (default: durable, in --data), memory (nothing survives a restart) or postgres://user:pass@host:port/db (any number of instances share it, the queues spread over them)"
        ) { c, v in
            guard v == "sqlite" || v == "memory" || OpqdConfiguration.isPostgresURL(v) else {
                throw ConfigurationError("--store must be sqlite, memory or a postgres:// URL; got '\(v)'")
            }
            c.store = v
        },
        Option(flag: "--sync", env: "OPQD_SYNC", help: "full (default: fsync every commit) or normal (WAL; a power loss may lose the last commits)") { c, v in
            guard v == "full" || v == "normal" else { throw ConfigurationError("--sync must be full or normal; got '\(v)'") }
            c.sync = v
        },
        Option(
            flag: "--token", env: "OPQD_TOKEN",
            help: "require 'Authorization: Bearer TOKEN' on every request but /healthz, /readyz and the dashboard page / (default: none)"
        ) {
            c, v in c.token = try secret(v, "--token")
        },
        Option(
            flag: "--read-token", env: "OPQD_READ_TOKEN",
            help: "a second token that may only read (GET/HEAD, incl. /metrics and the stream); needs --token (default: none)"
        ) { c, v in c.readToken = try secret(v, "--read-token") },
        Option(
            flag: "--webhook-secret", env: "OPQD_WEBHOOK_SECRET",
            help: "signs webhook deliveries: X-Opqd-Signature: sha256=<hex HMAC-SHA256 of the body> (default: none, unsigned)"
        ) { c, v in c.webhookSecret = try secret(v, "--webhook-secret") },
        Option(flag: "--webhook-timeout", env: "OPQD_WEBHOOK_TIMEOUT", help: "seconds a webhook POST may take before it is retried (default 10)") { c, v in
            c.webhookTimeout = try seconds(v, "--webhook-timeout", 0.1...3600)
        },
        Option(
            flag: "--webhook-backoff", env: "OPQD_WEBHOOK_BACKOFF", help: "seconds before the first retry of a failed delivery; doubles each time (default 1)"
        ) {
            c, v in c.webhookBackoff = try seconds(v, "--webhook-backoff", 0.01...3600)
        },
        Option(flag: "--webhook-max-backoff", env: "OPQD_WEBHOOK_MAX_BACKOFF", help: "the longest wait between retries of a delivery (default 300)") {
            c, v in c.webhookMaxBackoff = try seconds(v, "--webhook-max-backoff", 0.01...86_400)
        },
        Option(
            flag: "--webhook-buffer", env: "OPQD_WEBHOOK_BUFFER",
            help: "events one webhook observer holds in memory; a slower one reads the rest back from the store (default 256)"
        ) { c, v in c.webhookBuffer = try int(v, "--webhook-buffer", 1...1_000_000) },
        Option(flag: "--max-header-bytes", env: "OPQD_MAX_HEADER_BYTES", help: "request line plus headers in bytes (default 16384); larger gets 431") { c, v in
            c.limits.headerBytes = try int(v, "--max-header-bytes", 1024...(1 << 20))
        },
        Option(flag: "--max-queues", env: "OPQD_MAX_QUEUES", help: "most queues (default 10000); more get 429") { c, v in
            c.limits.queues = try int(v, "--max-queues", 1...10_000_000)
        },
        Option(flag: "--max-unfinished", env: "OPQD_MAX_UNFINISHED", help: "most unfinished operations in all queues (default 1000000); more get 429") { c, v in
            c.limits.unfinished = try int(v, "--max-unfinished", 1...100_000_000)
        },
        Option(
            flag: "--max-unfinished-per-queue", env: "OPQD_MAX_UNFINISHED_PER_QUEUE",
            help: "most unfinished operations in one queue (default 100000); more get 429"
        ) { c, v in
            c.limits.unfinishedPerQueue = try int(v, "--max-unfinished-per-queue", 1...100_000_000)
        },
        Option(flag: "--max-limiters", env: "OPQD_MAX_LIMITERS", help: "limiters (default 1000)") { c, v in
            c.limits.limiters = try int(v, "--max-limiters", 1...1_000_000)
        },
        Option(
            flag: "--max-limiter-keys", env: "OPQD_MAX_LIMITER_KEYS",
            help: "keys in use per limiter; a key with nothing running or waiting and a full bucket is forgotten (default 100000)"
        ) { c, v in
            c.limits.limiterKeys = try int(v, "--max-limiter-keys", 1...10_000_000)
        },
        Option(flag: "--breaker-failures", env: "OPQD_BREAKER_FAILURES", help: "failures in a row to one host that open its breaker (default 5)") {
            c, v in c.limits.breaker.failures = try int(v, "--breaker-failures", 1...1_000_000)
        },
        Option(flag: "--breaker-open", env: "OPQD_BREAKER_OPEN", help: "seconds an opened host stays open, doubled at each reopening (default 5)") {
            c, v in c.limits.breaker.openSeconds = try seconds(v, "--breaker-open", 0.01...86_400)
        },
        Option(flag: "--breaker-max-open", env: "OPQD_BREAKER_MAX_OPEN", help: "seconds a host stays open at most (default 300)") { c, v in
            c.limits.breaker.maxOpenSeconds = try seconds(v, "--breaker-max-open", 0.01...86_400)
        },
        Option(flag: "--max-hosts", env: "OPQD_MAX_HOSTS", help: "target hosts tracked; a closed host with nothing held is the first forgotten (default 10000)")
        {
            c, v in c.limits.breaker.maxHosts = try int(v, "--max-hosts", 1...10_000_000)
        },
        Option(flag: "--max-schedules", env: "OPQD_MAX_SCHEDULES", help: "schedules in all queues (default 10000); more get 429") { c, v in
            c.limits.schedules = try int(v, "--max-schedules", 1...1_000_000)
        },
        Option(flag: "--max-dependencies", env: "OPQD_MAX_DEPENDENCIES", help: "dependencies of one operation, a barrier's included (default 1000)") { c, v in
            c.limits.dependencies = try int(v, "--max-dependencies", 1...1_000_000)
        },
        Option(flag: "--max-batch", env: "OPQD_MAX_BATCH", help: "operations one POST /v1/operations:batch may create (default 1000)") { c, v in
            c.limits.batch = try int(v, "--max-batch", 1...100_000)
        },
        Option(flag: "--max-observers-per-operation", env: "OPQD_MAX_OBSERVERS_PER_OPERATION", help: "webhook observers of one operation (default 16)") {
            c, v in
            c.limits.observersPerOperation = try int(v, "--max-observers-per-operation", 1...100_000)
        },
        Option(flag: "--max-observers-per-queue", env: "OPQD_MAX_OBSERVERS_PER_QUEUE", help: "webhook observers on one queue's operations (default 256)") {
            c, v in
            c.limits.observersPerQueue = try int(v, "--max-observers-per-queue", 1...1_000_000)
        },
        Option(flag: "--max-observers", env: "OPQD_MAX_OBSERVERS", help: "webhook observers in all (default 10000)") { c, v in
            c.limits.observers = try int(v, "--max-observers", 1...10_000_000)
        },
        Option(
            flag: "--max-idempotency-keys", env: "OPQD_MAX_IDEMPOTENCY_KEYS", help: "Idempotency-Key answers kept (default 100000); a new key past it gets 429"
        ) { c, v in
            c.limits.idempotencyKeys = try int(v, "--max-idempotency-keys", 1...100_000_000)
        },
        Option(flag: "--max-idempotency-bytes", env: "OPQD_MAX_IDEMPOTENCY_BYTES", help: "bytes of kept Idempotency-Key answers (default 67108864)") { c, v in
            c.limits.idempotencyBytes = try int(v, "--max-idempotency-bytes", 4096...(1 << 40))
        },
        Option(flag: "--max-result-bytes", env: "OPQD_MAX_RESULT_BYTES", help: "JSON bytes of a result or error a worker or kind reports (default 65536)") {
            c, v in
            c.limits.resultBytes = try int(v, "--max-result-bytes", 256...(64 << 20))
        },
        Option(flag: "--max-commands", env: "OPQD_MAX_COMMANDS", help: "command children running at once (default 16); more wait for a slot") { c, v in
            c.limits.commands = try int(v, "--max-commands", 1...4096)
        },
        Option(flag: "--max-page-bytes", env: "OPQD_MAX_PAGE_BYTES", help: "bytes of one list answer (default 1048576); next carries on") { c, v in
            c.limits.pageBytes = try int(v, "--max-page-bytes", 4096...(1 << 30))
        },
        Option(
            flag: "--sse-max-backlog", env: "OPQD_SSE_MAX_BACKLOG", help: "bytes an event-stream client may fall behind before it is cut off (default 1048576)"
        ) { c, v in
            c.limits.sseBacklog = try int(v, "--sse-max-backlog", 4096...(1 << 30))
        },
        Option(flag: "--threads", env: "OPQD_THREADS", help: "HTTP worker threads (default: number of cores)") { c, v in
            c.threads = try int(v, "--threads", 1...256)
        },
        Option(flag: "--max-body", env: "OPQD_MAX_BODY", help: "largest request body in bytes (default 1048576); larger gets 413") { c, v in
            c.maxBody = try int(v, "--max-body", 1024...(1 << 30))
        },
        Option(flag: "--default-max-concurrent", env: "OPQD_DEFAULT_MAX_CONCURRENT", help: "what maxConcurrentOperationCount -1 means (default 4)") { c, v in
            c.defaultMaxConcurrent = try int(v, "--default-max-concurrent", 1...100_000)
        },
        Option(flag: "--log-level", env: "OPQD_LOG_LEVEL", help: "trace, debug, info, notice, warning, error, critical (default info)") { c, v in
            c.logLevel = try level(v)
        },
        Option(flag: "--event-capacity", env: "OPQD_EVENT_CAPACITY", help: "events kept for the change feed (default 200000); older cursors get 410") { c, v in
            c.eventCapacity = try int(v, "--event-capacity", 16...100_000_000)
        },
        Option(flag: "--retain", env: "OPQD_RETAIN", help: "seconds finished operations are kept (default 86400)") { c, v in
            c.retain = try seconds(v, "--retain", 1...3_153_600_000)  // up to 100 years
        },
        Option(flag: "--connection-timeout", env: "OPQD_CONNECTION_TIMEOUT", help: "seconds an idle keep-alive connection is kept (default 30)") { c, v in
            c.connectionTimeout = try int(v, "--connection-timeout", 1...3600)
        },
        Option(flag: "--connection-limit", env: "OPQD_CONNECTION_LIMIT", help: "most concurrent connections (default 4096)") { c, v in
            c.connectionLimit = try int(v, "--connection-limit", 1...1_000_000)
        },
        Option(
            flag: "--allow-command", env: "OPQD_ALLOW_COMMANDS",
            help:
                "an executable (absolute path) command operations may run; repeatable; the variable takes a colon-separated list. Default: none (kind command off)"
        ) { c, v in
            for path in v.split(separator: ":").map(String.init) where !path.isEmpty {
                guard path.hasPrefix("/") else { throw ConfigurationError("--allow-command needs an absolute path; got '\(path)'") }
                if !c.allowCommands.contains(path) { c.allowCommands.append(path) }
            }
        },
    ]

    /// Reads `OPQD_*` variables, then flags (`--flag value` or `--flag=value`).
    public static func parse(arguments: [String], environment: [String: String]) throws -> OpqdConfiguration {
        var c = OpqdConfiguration()
        c.threads = max(1, System.coreCount)
        for o in options { if let v = environment[o.env] { try o.apply(&c, v) } }
        // A flag wins over its variable: a repeatable flag given on the command line replaces the list.
        if arguments.contains(where: { $0 == "--allow-command" || $0.hasPrefix("--allow-command=") }) { c.allowCommands = [] }
        for (flag, value) in try flagPairs(arguments, known: { name in options.contains { $0.flag == name } }) {
            try options.first { $0.flag == flag }?.apply(&c, value)
        }
        if c.readToken != nil && c.token == nil {
            throw ConfigurationError("--read-token needs --token as well (a read-only token alone would leave writes open)")
        }
        if let r = c.readToken, r == c.token {
            throw ConfigurationError("--read-token must differ from --token")
        }
        return c
    }

    /// `arguments` as (flag, value) pairs, from `--flag value` or `--flag=value`, in order.
    /// `known` is asked before a value is looked for, so a typo is reported as an unknown
    /// option, not as one that needs a value. Shared by `opqd` and `opqd healthcheck`.
    static func flagPairs(_ arguments: [String], known: (String) -> Bool) throws -> [(flag: String, value: String)] {
        var pairs: [(flag: String, value: String)] = []
        var i = 0
        while i < arguments.count {
            let arg = arguments[i]
            var name = arg, value: String? = nil
            if let eq = arg.firstIndex(of: "=") { name = String(arg[..<eq]); value = String(arg[arg.index(after: eq)...]) }
            guard known(name) else { throw ConfigurationError("unknown option '\(arg)'; see opqd --help") }
            if value == nil {
                i += 1
                guard i < arguments.count else { throw ConfigurationError("\(name) needs a value") }
                value = arguments[i]
            }
            pairs.append((name, value ?? ""))
            i += 1
        }
        return pairs
    }

    /// The `--help` text.
    public static var help: String {
        var s = """
            opqd — operation queues with NSOperation semantics over HTTP.

            usage: opqd [options]
                   opqd healthcheck [--url URL] [--timeout SECONDS]
                   opqd archive export|import --url URL --queue NAME [--token TOKEN]   (opqd archive --help)

            Every option can also be set with its environment variable; a flag wins over the variable.

            """
        func row(_ flag: String, _ env: String, _ help: String) -> String {
            "  \(flag.padding(toLength: 30, withPad: " ", startingAt: 0)) \(env.padding(toLength: 34, withPad: " ", startingAt: 0)) \(help)\n"
        }
        s += row("flag", "variable", "meaning (default)")
        for o in options { s += row(o.flag, o.env, o.help) }
        s += row("--help, -h", "", "this text") + "\n"
        s += HealthcheckOptions.help
        return s
    }
}

/// A bad flag or variable.
public struct ConfigurationError: Error, CustomStringConvertible, Sendable {
    public let description: String
    package init(_ d: String) { description = d }
}

enum System {
    static var coreCount: Int { Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))) }
}
