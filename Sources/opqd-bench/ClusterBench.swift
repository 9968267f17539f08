// `opqd-bench cluster`: one opqd on SQLite beside 1, 2 and 3 opqd instances on one PostgreSQL
// database (`--store postgres://…`, a fresh database for each N), in one run, in both ownership
// modes: `one` (one instance owns every queue, the others forward to it; the baseline) and
// `partitions` (the default: queues spread over the instances by partition). With partitions the
// creates go to 12 queues and the jobs to 8, so that every instance owns some; clients still
// round-robin over the instances (as behind a load balancer), so (N-1)/N of their requests are
// forwarded. For each setup:
//   (a) durable creates/s: C client threads, each on its own keep-alive connection to instance
//       (client mod N), POST /v1/queues/{q}/operations for S seconds into 4 suspended queues
//       (every 201 answered after its commit, by the owner, forwarded by the others);
//   (b) external jobs/s: J external operations pre-created (1,000-operation batches, through the
//       owner) in a suspended queue, resumed, then W workers spread the same way claim up to B
//       at a time (claim?wait=1&max=B) and finish each batch in one POST /v1/operations:finish,
//       until the queue is empty or S seconds passed;
//   (c) latency of a simple GET (GET /v1/queues/{q}, queue-scoped): sequential requests on one
//       keep-alive connection to the owner (direct) and to a non-owner (forwarded).
// CPU: utime + stime of every opqd process from /proc/PID/stat before and after (a) and (b),
// per 1,000 operations, summed and per process; and PostgreSQL's (the postmaster's own and
// reaped children's times plus its live children's, when the server runs on this machine). On 2
// cores the instances share the CPU with PostgreSQL and the clients: read the ratios, not the
// absolute figures.
import Dispatch
import Foundation
import PostgresStore

#if canImport(Glibc)
import Glibc
#endif

enum ClusterBench {
    static let usage =
        "usage: opqd-bench cluster --postgres URL [--seconds S] [--clients C] [--workers W] [--jobs J] [--batch B] [--gets N] [--instances 1,2,3] [--modes one,partitions] [--direct] [--quick]\n"
        + "  URL: a server opqd may create databases on (scripts/pg.sh start DIR prints one); default $OPQD_TEST_POSTGRES_URL\n"
        + "  --direct: with partitions, each client creates only in the queues its instance holds (as a client that knows the\n"
        + "            owners would), so no create is forwarded; without it (N-1)/N are\n"

    struct Options {
        var seconds = 5.0
        var clients = 16
        var workers = 8
        var jobs = 50_000
        var batch = 50
        var gets = 2_000
        var instances = [1, 2, 3]
        var modes = ["one", "partitions"]
        var direct = false
    }

    /// What one setup measured.
    struct Outcome {
        let label: String
        let instances: Int
        var started = 0
        var ownerIndex = -1
        var creates = 0, createFailures = 0
        var createSeconds = 0.0
        var createCPU: [Double] = []
        /// PostgreSQL's CPU seconds (the postmaster and its children) in (a) and (b); nil for SQLite.
        var createPostgresCPU: Double?
        var jobPostgresCPU: Double?
        var jobs = 0, jobFailures = 0
        var jobSeconds = 0.0
        var jobCPU: [Double] = []
        var direct: [Double] = []
        var forwarded: [Double] = []
        var problems: [String] = []
        /// What the instances and PostgreSQL counted during (a).
        var createCounts: Counts?

        var createsPerSecond: Double { createSeconds > 0 ? Double(creates) / createSeconds : 0 }
        var jobsPerSecond: Double { jobSeconds > 0 ? Double(jobs) / jobSeconds : 0 }
        static func per1000(_ cpu: [Double], _ n: Int) -> Double { n > 0 ? cpu.reduce(0, +) / Double(n) * 1000 : 0 }
    }

    static func main(_ args: [String]) -> Int32 {
        var server = TestPostgres.serverURL
        var o = Options()
        var i = 0
        while i < args.count {
            let value = i + 1 < args.count ? args[i + 1] : nil
            switch (args[i], value) {
            case ("--quick", _): o.seconds = 2; o.jobs = 10_000; o.gets = 500; i -= 1
            case ("--direct", _): o.direct = true; i -= 1
            case let ("--postgres", v?): server = v
            case let ("--seconds", v?): o.seconds = max(0.5, Double(v) ?? o.seconds)
            case let ("--clients", v?): o.clients = max(1, min(Int(v) ?? o.clients, 256))
            case let ("--workers", v?): o.workers = max(1, min(Int(v) ?? o.workers, 64))
            case let ("--jobs", v?): o.jobs = max(100, Int(v) ?? o.jobs)
            case let ("--batch", v?): o.batch = max(1, min(Int(v) ?? o.batch, 100))
            case let ("--gets", v?): o.gets = max(10, Int(v) ?? o.gets)
            case let ("--instances", v?): o.instances = v.split(separator: ",").compactMap { Int($0) }.filter { (1...8).contains($0) }
            case let ("--modes", v?): o.modes = v.split(separator: ",").map(String.init).filter { $0 == "one" || $0 == "partitions" }
            default:
                eprint("opqd-bench cluster: unknown option '\(args[i])'\n" + usage)
                return 2
            }
            i += 2
        }
        guard let server else {
            eprint("opqd-bench cluster: no PostgreSQL server: pass --postgres URL\n" + usage)
            return 2
        }
        print("opqd-bench cluster: SQLite single instance vs N = \(o.instances.map(String.init).joined(separator: ", ")) instances on one PostgreSQL database")
        print("postgres: \(PostgresStore.redact(server))" + ((try? TestPostgres.psql(server, "SELECT ', ' || current_setting('server_version')")) ?? ""))
        print(BenchSupport.machineLine())
        print("opqd: \(BenchSupport.opqdBinary())")
        print(
            "(a) \(o.clients) clients creating delay operations for \(BenchSupport.fmt(o.seconds, 1)) s; (b) \(BenchSupport.grouped(Double(o.jobs))) external jobs, "
                + "\(o.workers) workers claiming up to \(o.batch) and finishing them in one request, at most \(BenchSupport.fmt(2 * o.seconds, 1)) s; "
                + "(c) \(o.gets) sequential GET /v1/queues/{q} direct and forwarded. Clients and workers round-robin over the instances"
                + (o.direct ? "; with partitions each client creates only in queues its instance holds (--direct)." : "."))

        var results: [Outcome] = []
        eprint("cluster: sqlite, 1 instance...\n")
        results.append(run(label: "sqlite", instances: 1, postgres: nil, ownership: "one", o))
        for mode in o.modes {
            for n in o.instances {
                eprint("cluster: postgres (\(mode)), \(n) instance(s)...\n")
                results.append(run(label: mode == "one" ? "pg-one" : "pg-parts", instances: n, postgres: server, ownership: mode, o))
            }
        }

        print("")
        let header = [
            ("store", 9), ("N", 2), ("creates/s", 10), ("CPU s/1k", 9), ("PG s/1k", 8), ("jobs/s", 9), ("CPU s/1k", 9), ("PG s/1k", 8),
            ("GET direct p50/p99 ms", 22),
            ("GET forwarded p50/p99 ms", 25),
        ]
        print(header.map { BenchSupport.pad($0.0, $0.1, right: $0.0 != "store") }.joined(separator: " "))
        func ms(_ l: [Double]) -> String {
            guard !l.isEmpty else { return "-" }
            let s = l.sorted()
            return BenchSupport.fmt(BenchSupport.percentile(s, 0.5) * 1000, 2) + " / " + BenchSupport.fmt(BenchSupport.percentile(s, 0.99) * 1000, 2)
        }
        for r in results {
            guard r.started == r.instances else {
                print(
                    BenchSupport.pad(r.label, 9) + " " + BenchSupport.pad(String(r.instances), 2, right: true) + "  did not start: " + (r.problems.first ?? "?")
                )
                continue
            }
            let cells = [
                BenchSupport.pad(r.label, 9), BenchSupport.pad(String(r.instances), 2, right: true),
                BenchSupport.pad(BenchSupport.grouped(r.createsPerSecond), 10, right: true),
                BenchSupport.pad(BenchSupport.fmt(Outcome.per1000(r.createCPU, r.creates), 3), 9, right: true),
                BenchSupport.pad(r.createPostgresCPU.map { BenchSupport.fmt(Outcome.per1000([$0], r.creates), 3) } ?? "-", 8, right: true),
                BenchSupport.pad(BenchSupport.grouped(r.jobsPerSecond), 9, right: true),
                BenchSupport.pad(BenchSupport.fmt(Outcome.per1000(r.jobCPU, r.jobs), 3), 9, right: true),
                BenchSupport.pad(r.jobPostgresCPU.map { BenchSupport.fmt(Outcome.per1000([$0], r.jobs), 3) } ?? "-", 8, right: true),
                BenchSupport.pad(ms(r.direct), 22, right: true), BenchSupport.pad(ms(r.forwarded), 25, right: true),
            ]
            print(cells.joined(separator: " "))
        }
        print(
            "(CPU s/1k = user+system CPU seconds of all opqd processes per 1,000 operations, PG s/1k the same of PostgreSQL; pg-one: one owner, pg-parts: queues spread by partition; per opqd process, the owner (pg-one) first:)"
        )
        for r in results where r.started == r.instances {
            func split(_ cpu: [Double], _ n: Int) -> String {
                guard n > 0, !cpu.isEmpty else { return "-" }
                var order = Array(cpu.indices)
                if r.ownerIndex >= 0 { order = [r.ownerIndex] + order.filter { $0 != r.ownerIndex } }
                return order.map { BenchSupport.fmt(cpu[$0] / Double(n) * 1000, 3) }.joined(separator: " + ")
            }
            print(
                "  \(r.label) N=\(r.instances): creates \(split(r.createCPU, r.creates)) (\(r.creates) in \(BenchSupport.fmt(r.createSeconds, 2)) s, \(r.createFailures) not 201); "
                    + "jobs \(split(r.jobCPU, r.jobs)) (\(r.jobs) in \(BenchSupport.fmt(r.jobSeconds, 2)) s, \(r.jobFailures) refused)")
        }
        print(
            "(counts of (a): store commits of the instances and records per commit; per instance commits/s × records/commit; requests forwarded; PostgreSQL's pg_stat_database of the bench's database; statements from pg_stat_statements when preloaded:)"
        )
        for r in results where r.started == r.instances { printCounts(r) }
        var failures: [String] = []
        for r in results { for p in r.problems { failures.append("\(r.label) N=\(r.instances): \(p)") } }
        if !failures.isEmpty {
            print("")
            print("PROBLEMS:")
            for f in failures { print("  !! \(f)") }
        }
        var summary: [(String, Any)] = []
        for r in results where r.started == r.instances {
            let key = "\(r.label)_\(r.instances)"
            summary.append(("creates_per_s_\(key)", Int(r.createsPerSecond.rounded())))
            summary.append(("jobs_per_s_\(key)", Int(r.jobsPerSecond.rounded())))
            summary.append(("create_cpu_s_per_1k_\(key)", BenchSupport.round3(Outcome.per1000(r.createCPU, r.creates))))
            summary.append(("job_cpu_s_per_1k_\(key)", BenchSupport.round3(Outcome.per1000(r.jobCPU, r.jobs))))
            if let c = r.createPostgresCPU { summary.append(("create_pg_cpu_s_per_1k_\(key)", BenchSupport.round3(Outcome.per1000([c], r.creates)))) }
            if let d = r.createCounts, r.creates > 0 {
                summary.append(("create_commits_per_1k_\(key)", BenchSupport.round3(d.commits.reduce(0, +) * 1000 / Double(r.creates))))
                if let x = d.database?["xact_commit"] { summary.append(("create_pg_xacts_per_1k_\(key)", BenchSupport.round3(x * 1000 / Double(r.creates)))) }
                if !d.statements.isEmpty {
                    summary.append(
                        ("create_pg_statements_per_1k_\(key)", BenchSupport.round3(d.statements.values.reduce(0) { $0 + $1.calls } * 1000 / Double(r.creates))))
                }
            }
            if let c = r.jobPostgresCPU { summary.append(("job_pg_cpu_s_per_1k_\(key)", BenchSupport.round3(Outcome.per1000([c], r.jobs)))) }
            if !r.direct.isEmpty { summary.append(("get_direct_p50_ms_\(key)", BenchSupport.round3(BenchSupport.percentile(r.direct.sorted(), 0.5) * 1000))) }
            if !r.forwarded.isEmpty {
                summary.append(("get_forwarded_p50_ms_\(key)", BenchSupport.round3(BenchSupport.percentile(r.forwarded.sorted(), 0.5) * 1000)))
                summary.append(("get_forwarded_p99_ms_\(key)", BenchSupport.round3(BenchSupport.percentile(r.forwarded.sorted(), 0.99) * 1000)))
            }
        }
        summary.append(("ok", failures.isEmpty))
        print(BenchSupport.jsonLine(summary))
        return failures.isEmpty ? 0 : 1
    }

    // MARK: - one setup

    static func run(label: String, instances n: Int, postgres: String?, ownership: String, _ o: Options) -> Outcome {
        var out = Outcome(label: label, instances: n)
        var database: String?
        defer { if let database, let postgres { _ = try? TestPostgres.psql(postgres, "DROP DATABASE IF EXISTS \(database) WITH (FORCE)") } }
        var extra = ["--max-unfinished", "100000000", "--max-unfinished-per-queue", "100000000"]
        if let postgres {
            let name = "opqd_bench_\(UInt64.random(in: 0...UInt64.max))"
            do { try TestPostgres.psql(postgres, "CREATE DATABASE \(name)") } catch {
                out.problems.append("cannot create a database: \(error)")
                return out
            }
            database = name
            extra += ["--store", TestPostgres.url(postgres, database: name), "--ownership", ownership]
        }
        let spread = postgres != nil && ownership == "partitions"
        var servers: [OpqdServer] = []
        defer { for s in servers { s.stop() } }
        for k in 0..<n {
            do { servers.append(try OpqdServer(label: "cluster-\(label)-\(k)", extra: extra, startTimeout: 30)) } catch {
                // The log's last lines say why; one line of them for the table.
                let why = "\(error)".split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
                out.problems.append("instance \(k + 1) of \(n): " + why.suffix(2).joined(separator: " | ").prefix(400))
                return out
            }
        }
        out.started = n
        // The owner: the instance whose own /v1/cluster entry says so (`mode: single`: the one).
        // With partitions: every instance owns some (the one the requests go to first).
        var owner: Int?
        let deadline = BenchSupport.now() + 30
        while owner == nil && BenchSupport.now() < deadline {
            let owners = servers.indices.filter { isOwner(servers[$0]) }
            // Spread: and every instance ready, i.e. holding its whole share of the partitions.
            let ready = !spread || servers.allSatisfy { (try? $0.request("GET", "/readyz").status) == 200 }
            if spread ? owners.count == n && ready : owners.count == 1 { owner = owners[0] } else { usleep(100_000) }
        }
        guard let owner else {
            out.problems.append(spread ? "not every instance owned partitions within 30 s" : "no single owner within 30 s")
            return out
        }
        out.ownerIndex = spread ? -1 : owner
        let ports = servers.map(\.port)
        let pids = servers.map(\.pid)
        // Spread: names picked so that every instance holds its share of the queues (by name
        // alone, 12 queues over 64 partitions can leave an instance none), and runs compare.
        let held = spread ? partitionHolders(servers) : [:]
        let queues = spread ? balancedNames("q", count: 12, holders: held, instances: n) : ["a", "b", "c", "d"]
        let jobQueues = spread ? balancedNames("jobs", count: 8, holders: held, instances: n) : ["jobs"]
        do {
            for q in queues { try retrying { try servers[owner].createQueue(q, suspended: true) } }
            for q in jobQueues { try retrying { try servers[owner].createQueue(q, suspended: true, maxConcurrent: max(64, o.workers * o.batch)) } }
        } catch {
            out.problems.append("\(error)")
            return out
        }

        // (a) durable creates.
        let body = Array(#"{"kind":"delay","spec":{"seconds":60}}"#.utf8)
        var postmaster: pid_t?
        if let postgres, let database { postmaster = postmasterPID(TestPostgres.url(postgres, database: database)) }
        let databaseURL = postgres.flatMap { p in database.map { TestPostgres.url(p, database: $0) } }
        let statements = databaseURL.map(enableStatements) ?? false
        let counts0 = counts(servers, database: databaseURL, statements: false, settle: true)
        if statements, let databaseURL { resetStatements(databaseURL) }
        let pg0 = postmaster.map(postgresCPU)
        let pgByPID0 = postmaster.map(postgresCPUByPID) ?? [:]
        let cpu0 = pids.map(cpuSeconds)
        // Direct: client c (on instance c mod n) takes turns over the queues instance c mod n holds
        // (`balancedNames` dealt queue i to instance i mod n).
        let (clients, direct) = (o.clients, spread && o.direct && queues.count % n == 0)
        // Otherwise: client c's j-th create goes to queue (c + j) mod 12, whose holder is
        // (c + j) mod n (12 is a multiple of 2 and 3), so every client's creates go round the
        // holders and (n - 1)/n are forwarded at any n. (Before, `k mod 12` kept each client on
        // queues of its own instance at n = 2: none was forwarded there.)
        let (created, failed, wall) = forEachClient(ports: ports, clients: o.clients, seconds: o.seconds) { c, k in
            let q = direct ? queues[(k % clients) % n + n * ((k / clients) % (queues.count / n))] : queues[(k % clients + k / clients) % queues.count]
            return (try? c.request("POST", "/v1/queues/\(q)/operations", body: body).status) == 201
        }
        let cpu1 = pids.map(cpuSeconds)
        out.createPostgresCPU = postmaster.map(postgresCPU).flatMap { a in pg0.map { a - $0 } }
        let pgByPID1 = postmaster.map(postgresCPUByPID) ?? [:]
        (out.creates, out.createFailures, out.createSeconds) = (created, failed, wall)
        out.createCPU = zip(cpu1, cpu0).map { $0 - $1 }
        out.createCounts = counts(servers, database: databaseURL, statements: statements, settle: true).since(counts0)
        if let databaseURL, let total = out.createPostgresCPU {
            out.createCounts?.postgresCPU = postgresCPUByKind(databaseURL, before: pgByPID0, after: pgByPID1, total: total)
        }
        if failed > 0 { out.problems.append("\(failed) creates not answered 201") }

        // (b) external jobs.
        do {
            for q in jobQueues {
                let bad = try WorkersBench.precreate(server: servers[owner], queue: q, count: o.jobs / jobQueues.count, connections: 4)
                if !bad.isEmpty { out.problems.append("pre-create answered \(bad) (status: count)") }
                let r = try servers[owner].request("POST", "/v1/queues/\(q)/resume")
                if r.status != 200 { throw BenchError("resume: HTTP \(r.status) \(r.text.prefix(200))") }
            }
        } catch {
            out.problems.append("jobs setup: \(error)")
            return out
        }
        let pg2 = postmaster.map(postgresCPU)
        let cpu2 = pids.map(cpuSeconds)
        let (finished, refused, jobWall) = work(ports: ports, queues: jobQueues, workers: o.workers, batch: o.batch, seconds: 2 * o.seconds)
        let cpu3 = pids.map(cpuSeconds)
        out.jobPostgresCPU = postmaster.map(postgresCPU).flatMap { a in pg2.map { a - $0 } }
        (out.jobs, out.jobFailures, out.jobSeconds) = (finished, refused, jobWall)
        out.jobCPU = zip(cpu3, cpu2).map { $0 - $1 }
        if refused > 0 { out.problems.append("\(refused) claims or finishes refused") }

        // (c) a simple GET, direct and forwarded: to the instance that owns the queue and to another.
        let q = queues[0]
        let holder = spread ? (servers.indices.first { owns(servers[$0], queue: q) } ?? owner) : owner
        out.direct = latencies(port: ports[holder], path: "/v1/queues/\(q)", count: o.gets)
        if let other = ports.indices.first(where: { $0 != holder }) { out.forwarded = latencies(port: ports[other], path: "/v1/queues/\(q)", count: o.gets) }
        return out
    }

    /// Runs `body` until it does not throw, for up to 10 s (a queue's partition may be moving
    /// while the instances settle: 503).
    static func retrying(_ body: () throws -> Void) throws {
        let deadline = BenchSupport.now() + 10
        while true {
            do { return try body() } catch {
                if BenchSupport.now() > deadline { throw error }
                usleep(100_000)
            }
        }
    }

    /// The instance (index in `servers`) holding each partition, from each one's own entry in
    /// `GET /v1/cluster`.
    static func partitionHolders(_ servers: [OpqdServer]) -> [Int: Int] {
        var out: [Int: Int] = [:]
        for (k, server) in servers.enumerated() {
            guard let (status, j) = try? server.json("GET", "/v1/cluster"), status == 200,
                let me = (j["instances"] as? [[String: Any]])?.first(where: { $0["self"] as? Bool == true })
            else { continue }
            for p in (me["partitions"] as? [Any]) ?? [] { if let p = BenchSupport.int(p) { out[p] = k } }
        }
        return out
    }

    /// `count` names `prefix<k>`, dealt round-robin over the instances by the partition each
    /// falls in (instance i gets the i-th, (i+n)-th, ... of them), so that each holds
    /// count / n of them (the first ones one more when it does not divide). Plain `prefix0`...
    /// when the holders are not known.
    static func balancedNames(_ prefix: String, count: Int, holders: [Int: Int], instances n: Int) -> [String] {
        guard n > 1, holders.count == QueuePartitions.count else { return (0..<count).map { "\(prefix)\($0)" } }
        var out: [String] = []
        var k = 0
        while out.count < count && k < 100_000 {
            let name = "\(prefix)\(k)"
            k += 1
            if holders[QueuePartitions.of(queue: name)] == out.count % n { out.append(name) }
        }
        return out
    }

    /// Whether `server`'s own entry in `GET /v1/cluster` lists `queue` among its queues.
    static func owns(_ server: OpqdServer, queue: String) -> Bool {
        guard let (status, j) = try? server.json("GET", "/v1/cluster"), status == 200 else { return false }
        guard let me = (j["instances"] as? [[String: Any]])?.first(where: { $0["self"] as? Bool == true }) else { return false }
        return (me["queues"] as? [String])?.contains(queue) == true
    }

    /// Whether `server`'s own entry in `GET /v1/cluster` says it owns the queues.
    static func isOwner(_ server: OpqdServer) -> Bool {
        guard let (status, j) = try? server.json("GET", "/v1/cluster"), status == 200 else { return false }
        guard let me = (j["instances"] as? [[String: Any]])?.first(where: { $0["self"] as? Bool == true }) else { return false }
        return (me["owner"] as? Bool) ?? (j["mode"] as? String == "single")
    }

    /// utime + stime of `pid` in seconds, from /proc/PID/stat (fields 14 and 15, after the
    /// command name in parentheses).
    static func cpuSeconds(_ pid: pid_t) -> Double {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = text.lastIndex(of: ")") else { return 0 }
        let fields = text[text.index(after: close)...].split(separator: " ")
        // After ")": state is field 3, so utime (14) and stime (15) are at 11 and 12.
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// The PostgreSQL server's postmaster, when it runs on this machine: the parent of its
    /// checkpointer (a child that lives as long as the server; a psql session's own backend
    /// may be gone before its /proc entry is read). Nil if that cannot be read.
    static func postmasterPID(_ url: String) -> pid_t? {
        guard let text = try? TestPostgres.psql(url, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"), let child = Int32(text)
        else { return nil }
        guard let parent = statFields(child).flatMap({ Int32($0[1]) }), parent > 1, statFields(parent) != nil else { return nil }
        return parent
    }

    /// The fields of /proc/PID/stat after the command name (state first).
    static func statFields(_ pid: pid_t) -> [Substring]? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = text.lastIndex(of: ")") else { return nil }
        return text[text.index(after: close)...].split(separator: " ")
    }

    /// CPU seconds of PostgreSQL so far: the postmaster's own and its reaped children's
    /// (utime, stime, cutime, cstime), plus every live child's utime + stime.
    static func postgresCPU(_ postmaster: pid_t) -> Double {
        let tick = Double(sysconf(Int32(_SC_CLK_TCK)))
        var ticks = 0.0
        if let f = statFields(postmaster), f.count > 14 { ticks += f[11...14].compactMap { Double($0) }.reduce(0, +) }
        let parent = Substring(String(postmaster))
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let pid = Int32(entry), let f = statFields(pid), f.count > 12, f[1] == parent else { continue }
            ticks += (Double(f[11]) ?? 0) + (Double(f[12]) ?? 0)
        }
        return ticks / tick
    }

    /// `clients` threads, client k on its own keep-alive connection to `ports[k % ports.count]`,
    /// each sending `send` back to back for `seconds`; (succeeded, failed, seconds taken).
    static func forEachClient(ports: [UInt16], clients: Int, seconds: Double, _ send: @escaping @Sendable (KeepAliveClient, Int) -> Bool) -> (Int, Int, Double)
    {
        let good = Locked(0)
        let bad = Locked(0)
        let group = DispatchGroup()
        let ready = DispatchSemaphore(value: 0)
        let go = DispatchSemaphore(value: 0)
        let end = Locked(0.0)
        for k in 0..<clients {
            group.enter()
            let t = Thread {
                defer { group.leave() }
                let c = KeepAliveClient(port: Int(ports[k % ports.count]), retries: 0)
                defer { c.close() }
                try? c.connect()
                ready.signal()
                go.wait()
                let stop = end.withLock { $0 }
                var (ok, failed, n) = (0, 0, k)
                while BenchSupport.now() < stop {
                    if send(c, n) { ok += 1 } else { failed += 1 }
                    n += clients
                }
                good.withLock { $0 += ok }
                bad.withLock { $0 += failed }
            }
            t.stackSize = 1 << 20
            t.start()
        }
        for _ in 0..<clients { ready.wait() }
        let t0 = BenchSupport.now()
        end.withLock { $0 = t0 + seconds }
        for _ in 0..<clients { go.signal() }
        _ = group.wait(timeout: .now() + seconds + 60)
        return (good.withLock { $0 }, bad.withLock { $0 }, BenchSupport.now() - t0)
    }

    /// Batch workers, worker k on queue `queues[k % queues.count]` through `ports[k % ports.count]`:
    /// claim up to `batch` (a long poll of 1 s), finish them all in one request, until a claim
    /// answers 204 or `seconds` passed. (finished, refused, seconds from the start to the last finish).
    static func work(ports: [UInt16], queues: [String], workers: Int, batch: Int, seconds: Double) -> (Int, Int, Double) {
        let finished = Locked(0)
        let refused = Locked(0)
        let last = Locked(0.0)
        let t0 = BenchSupport.now()
        let stop = t0 + seconds
        let group = DispatchGroup()
        for k in 0..<workers {
            group.enter()
            let t = Thread {
                defer { group.leave() }
                let c = KeepAliveClient(port: Int(ports[k % ports.count]), retries: 0)
                defer { c.close() }
                let claim = Array(#"{"worker":"bench-\#(k)"}"#.utf8)
                while BenchSupport.now() < stop {
                    guard let r = try? c.request("POST", "/v1/queues/\(queues[k % queues.count])/claim?wait=1&max=\(batch)", body: claim) else {
                        refused.withLock { $0 += 1 }
                        break
                    }
                    if r.status == 204 { break }
                    guard r.status == 200 else {
                        refused.withLock { $0 += 1 }
                        continue
                    }
                    let ids = WorkersBench.scanAll(r.body, "\"operation\":{\"id\":\"")
                    let tokens = WorkersBench.scanAll(r.body, "\"token\":\"")
                    guard !ids.isEmpty, ids.count == tokens.count else {
                        refused.withLock { $0 += 1 }
                        break
                    }
                    let finishes = zip(ids, tokens).map { #"{"id":"\#($0)","leaseToken":"\#($1)","result":{"ok":true}}"# }.joined(separator: ",")
                    guard let f = try? c.request("POST", "/v1/operations:finish", body: Array(#"{"finishes":[\#(finishes)]}"#.utf8)), f.status == 200 else {
                        refused.withLock { $0 += ids.count }
                        continue
                    }
                    let ok = WorkersBench.count(f.body, "\"status\":200,\"operation\":{")
                    finished.withLock { $0 += ok }
                    if ok < ids.count { refused.withLock { $0 += ids.count - ok } }
                    let now = BenchSupport.now()
                    last.withLock { $0 = max($0, now) }
                }
            }
            t.stackSize = 1 << 20
            t.start()
        }
        _ = group.wait(timeout: .now() + seconds + 60)
        return (finished.withLock { $0 }, refused.withLock { $0 }, max(0, last.withLock { $0 } - t0))
    }

    /// Seconds each of `count` sequential GETs took on one keep-alive connection (after 50 to
    /// warm up); failed ones are left out.
    static func latencies(port: UInt16, path: String, count: Int) -> [Double] {
        let c = KeepAliveClient(port: Int(port), retries: 0)
        defer { c.close() }
        for _ in 0..<50 { _ = try? c.request("GET", path) }
        var out: [Double] = []
        out.reserveCapacity(count)
        for _ in 0..<count {
            let t = BenchSupport.now()
            guard let r = try? c.request("GET", path), r.status == 200 else { continue }
            out.append(BenchSupport.now() - t)
        }
        return out
    }
}
