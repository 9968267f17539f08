// What a cluster setup's creates cost in counts rather than seconds (on 2 shared cores the
// seconds are noisy, the counts are not): commits and records per commit of each instance,
// requests it forwarded, and from PostgreSQL the transactions, rows and statements (by kind,
// from pg_stat_statements when the server preloads it) of the bench's database.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

extension ClusterBench {
    /// One statement kind of pg_stat_statements (its normalised text, shortened).
    struct StatementCount {
        var calls = 0.0
        var rows = 0.0
        var milliseconds = 0.0
    }

    /// Counters read at one moment; `delta` of two is what a phase did.
    struct Counts {
        /// Per instance: store commits, records committed, requests it forwarded.
        var commits: [Double] = []
        var records: [Double] = []
        var forwarded: [Double] = []
        /// pg_stat_database of the bench's database (nil: not read).
        var database: [String: Double]?
        /// The newest event seq stored.
        var newestSeq = 0.0
        /// Since the last reset (`resetStatements`); empty when pg_stat_statements is not loaded.
        var statements: [String: StatementCount] = [:]
        /// PostgreSQL's CPU seconds by the kind of process (`postgresCPUByKind`).
        var postgresCPU: [String: Double] = [:]

        /// What happened between `before` and self (statements: self's, read after a reset).
        func since(_ before: Counts) -> Counts {
            var d = self
            d.commits = zip(commits, before.commits).map { $0 - $1 }
            d.records = zip(records, before.records).map { $0 - $1 }
            d.forwarded = zip(forwarded, before.forwarded).map { $0 - $1 }
            if let now = database, let then = before.database {
                d.database = now.reduce(into: [:]) { $0[$1.key] = $1.value - (then[$1.key] ?? 0) }
            }
            d.newestSeq = newestSeq - before.newestSeq
            return d
        }
    }

    static let databaseColumns = ["xact_commit", "xact_rollback", "tup_returned", "tup_fetched", "tup_inserted", "tup_updated", "tup_deleted"]

    /// Makes pg_stat_statements readable in `database` (false when the server does not preload it).
    static func enableStatements(_ database: String) -> Bool {
        (try? TestPostgres.psql(database, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT count(*) FROM pg_stat_statements")) != nil
    }

    /// Forgets the statements counted so far in `database`.
    static func resetStatements(_ database: String) {
        _ = try? TestPostgres.psql(
            database, "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)")
    }

    /// The counters now. PostgreSQL's backends report pg_stat_database about once a second when
    /// idle: wait that long first (`settle`) so that what the last phase did is in.
    static func counts(_ servers: [OpqdServer], database: String?, statements: Bool, settle: Bool) -> Counts {
        if settle, database != nil { usleep(1_200_000) }
        var c = Counts()
        for s in servers {
            let m = s.allMetrics()
            c.commits.append(m["opqd_store_commits_total"] ?? 0)
            c.records.append(m["opqd_store_records_total"] ?? 0)
            c.forwarded.append(m.filter { $0.key.hasPrefix("opqd_http_requests_total{") && $0.key.contains("route=\"forwarded\"") }.values.reduce(0, +))
        }
        guard let database else { return c }
        let columns = databaseColumns.joined(separator: " || '|' || ")
        if let row = try? TestPostgres.psql(
            database,
            "SELECT \(columns) || '|' || coalesce((SELECT max(seq) FROM opqd.events), 0) FROM pg_stat_database WHERE datname = current_database()")
        {
            let values = row.split(separator: "|").map { Double($0) ?? 0 }
            if values.count == databaseColumns.count + 1 {
                c.database = Dictionary(uniqueKeysWithValues: zip(databaseColumns, values))
                c.newestSeq = values[databaseColumns.count]
            }
        }
        if statements,
            let text = try? TestPostgres.psql(
                database,
                """
                SELECT calls || '|' || rows || '|' || round(total_exec_time::numeric, 3) || '|' || regexp_replace(left(query, 72), '\\s+', ' ', 'g') \
                || CASE WHEN query LIKE '%pg_notify%' AND left(query, 72) NOT LIKE '%pg_notify%' THEN ' … pg_notify' ELSE '' END \
                FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                """)
        {
            for line in text.split(separator: "\n") {
                let f = line.split(separator: "|", maxSplits: 3, omittingEmptySubsequences: false)
                guard f.count == 4, let calls = Double(f[0]) else { continue }
                var s = c.statements[String(f[3]), default: StatementCount()]
                s.calls += calls
                s.rows += Double(f[1]) ?? 0
                s.milliseconds += Double(f[2]) ?? 0
                c.statements[String(f[3])] = s
            }
        }
        return c
    }

    /// utime + stime of each live child of the postmaster, in seconds.
    static func postgresCPUByPID(_ postmaster: pid_t) -> [pid_t: Double] {
        let tick = Double(sysconf(Int32(_SC_CLK_TCK)))
        let parent = Substring(String(postmaster))
        var out: [pid_t: Double] = [:]
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let pid = Int32(entry), let f = statFields(pid), f.count > 12, f[1] == parent else { continue }
            out[pid] = ((Double(f[11]) ?? 0) + (Double(f[12]) ?? 0)) / tick
        }
        return out
    }

    /// PostgreSQL's CPU between two `postgresCPUByPID` readings, by what each process is, from
    /// its last statement (pg_stat_activity, read now; its connections do one thing each):
    /// `writer` (an instance's commits), `feed` (reads of the events after a seq), `listen`,
    /// `other sessions` (membership, reads, psql), `background` (WAL writer, checkpointer,
    /// autovacuum, ...); `postmaster` is the rest of `total` (the postmaster, exited children).
    static func postgresCPUByKind(_ database: String, before: [pid_t: Double], after: [pid_t: Double], total: Double) -> [String: Double] {
        var kinds: [pid_t: String] = [:]
        let text =
            (try? TestPostgres.psql(
                database,
                "SELECT pid || '|' || backend_type || '|' || coalesce(datname, '') || '|' || regexp_replace(left(query, 100), '\\s+', ' ', 'g') FROM pg_stat_activity"
            )) ?? ""
        let name = database.split(separator: "?").first?.split(separator: "/").last.map(String.init) ?? ""
        for line in text.split(separator: "\n") {
            let f = line.split(separator: "|", maxSplits: 3, omittingEmptySubsequences: false).map(String.init)
            guard f.count == 4, let pid = Int32(f[0]) else { continue }
            let q = f[3]
            let kind: String
            if f[1] != "client backend" {
                kind = "background"
            } else if f[2] != name {
                kind = "other sessions"
            } else if q.hasPrefix("LISTEN") {
                kind = "listen"
            } else if q.contains("FROM opqd.events WHERE seq >") {
                kind = "feed"
            } else if ["BEGIN", "COMMIT", "ROLLBACK", "SELECT 1"].contains(q) || q.contains("opqd.mark(") || q.contains("opqd.fence")
                || q.contains("INSERT INTO opqd.") || q.contains("opqd.event_seq") || q.contains("pg_advisory_xact_lock") || q.contains("pg_notify")
            {
                kind = "writer"
            } else {
                kind = "other sessions"
            }
            kinds[pid] = kind
        }
        var out: [String: Double] = [:]
        for (pid, cpu) in after { out[kinds[pid] ?? "background", default: 0] += cpu - (before[pid] ?? 0) }
        out["postmaster"] = total - out.values.reduce(0, +)
        return out
    }

    /// The counts of (a), per 1,000 creates.
    static func printCounts(_ r: Outcome) {
        guard let d = r.createCounts, r.creates > 0 else { return }
        let k = 1000 / Double(r.creates)
        func per(_ v: Double) -> String { BenchSupport.fmt(v * k, v * k < 10 ? 1 : 0) }
        var line = "  \(r.label) N=\(r.instances), per 1,000 creates:"
        let commits = d.commits.reduce(0, +)
        line += " opqd commits \(per(commits)) (records/commit \(BenchSupport.fmt(commits > 0 ? d.records.reduce(0, +) / commits : 0, 1))"
        line +=
            ", per instance "
            + zip(d.commits, d.records).map { c, rec in
                "\(BenchSupport.fmt(c / max(r.createSeconds, 0.001), 0))/s × \(BenchSupport.fmt(c > 0 ? rec / c : 0, 1))"
            }.joined(separator: ", ") + ")"
        line += ", forwarded \(per(d.forwarded.reduce(0, +)))"
        if !d.statements.isEmpty {
            line += ", NOTIFYs sent \(per(d.statements.filter { $0.key.contains("pg_notify") }.values.reduce(0) { $0 + $1.calls }))"
            let feed = d.statements.filter { $0.key.hasPrefix("SELECT seq, time, queue") }.values
            let reads = feed.reduce(0) { $0 + $1.calls }
            let rows = feed.reduce(0) { $0 + $1.rows }
            line += ", feed reads \(per(reads)) (rows per event \(BenchSupport.fmt(d.newestSeq > 0 ? rows / d.newestSeq : 0, 2)))"
        }
        if let db = d.database {
            line += "; PostgreSQL xact_commit \(per(db["xact_commit"] ?? 0)), events \(per(d.newestSeq))"
            line += ", tuples returned \(per(db["tup_returned"] ?? 0)) fetched \(per(db["tup_fetched"] ?? 0))"
            line += " inserted \(per(db["tup_inserted"] ?? 0)) updated \(per(db["tup_updated"] ?? 0))"
        }
        print(line)
        if !d.postgresCPU.isEmpty {
            print(
                "    PostgreSQL CPU s per 1,000 creates by process: "
                    + d.postgresCPU.sorted { $0.value > $1.value }.map { "\($0.key) \(BenchSupport.fmt($0.value * k, 3))" }.joined(separator: ", "))
        }
        guard !d.statements.isEmpty else { return }
        let total = d.statements.values.reduce(StatementCount()) {
            StatementCount(calls: $0.calls + $1.calls, rows: $0.rows + $1.rows, milliseconds: $0.milliseconds + $1.milliseconds)
        }
        print("    statements \(per(total.calls)), exec ms \(per(total.milliseconds)) (calls, rows, exec ms per 1,000 creates; the most called:)")
        for (query, s) in d.statements.sorted(by: { $0.value.calls > $1.value.calls }).prefix(14) where s.calls * k >= 0.5 {
            print(
                "    " + BenchSupport.pad(per(s.calls), 7, right: true) + BenchSupport.pad(per(s.rows), 8, right: true)
                    + BenchSupport.pad(per(s.milliseconds), 7, right: true) + "  " + query)
        }
    }
}

extension OpqdServer {
    /// Every `/metrics` sample, by its name with labels.
    func allMetrics() -> [String: Double] {
        guard let r = try? request("GET", "/metrics"), r.status == 200 else { return [:] }
        var out: [String: Double] = [:]
        for line in r.text.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let v = Double(line[line.index(after: space)...]) else { continue }
            out[String(line[..<space])] = v
        }
        return out
    }
}
