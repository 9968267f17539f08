import StoreKit

/// The store's tables, and how older files are brought up to date.
///
/// `PRAGMA user_version` holds the schema version and `PRAGMA application_id` marks the file
/// as opqd's, so a file of another program, or of a newer opqd, is refused instead of being
/// written over. Version N+1 is reached from N by `migrations[N]`, inside one transaction.
enum Schema {
    /// `opqd` in ASCII.
    static let applicationID: Int64 = 0x6F70_7164
    /// The version this build writes.
    static var version: Int { migrations.count }

    static let migrations: [String] = [
        // 0 -> 1: the first schema.
        """
        CREATE TABLE queues (
            name           TEXT PRIMARY KEY NOT NULL,
            max_concurrent INTEGER NOT NULL,   -- as configured: positive or -1
            effective_max  INTEGER NOT NULL,   -- the limit in force when written
            is_suspended   INTEGER NOT NULL,
            revision       INTEGER NOT NULL,
            created_at     INTEGER NOT NULL    -- ns since the Unix epoch
        ) WITHOUT ROWID;

        CREATE TABLE operations (
            id                 INTEGER PRIMARY KEY,  -- OperationID.raw
            queue              TEXT NOT NULL,
            name               TEXT,
            kind               TEXT NOT NULL,
            spec               TEXT,                 -- JSON; NULL = absent, 'null' = JSON null
            priority           INTEGER NOT NULL,     -- QueuePriority.rawValue (-8 ... 8)
            state              TEXT NOT NULL,        -- pending, ready, executing, paused, finished
            outcome            TEXT,
            is_cancelled       INTEGER NOT NULL,
            dependencies       TEXT NOT NULL,        -- JSON array of ids, e.g. [3,7]
            progress_completed REAL,
            progress_total     REAL,
            attempt            INTEGER NOT NULL,
            result             TEXT,                 -- JSON
            error              TEXT,                 -- JSON
            created_at         INTEGER NOT NULL,
            started_at         INTEGER,
            finished_at        INTEGER,
            revision           INTEGER NOT NULL,
            timeout            REAL,                 -- options.timeout, seconds
            retry              TEXT,                 -- options.retry as {"maxAttempts","backoff","multiplier"}
            not_before         INTEGER,              -- options.notBefore, ns
            executed_seconds   REAL NOT NULL,
            kind_state         TEXT                  -- JSON
        );
        CREATE INDEX operations_by_queue ON operations(queue);
        CREATE INDEX operations_finished ON operations(finished_at) WHERE state = 'finished';

        CREATE TABLE events (
            seq       INTEGER PRIMARY KEY,
            time      INTEGER NOT NULL,
            queue     TEXT NOT NULL,
            operation INTEGER NOT NULL,
            key       TEXT NOT NULL,
            old       TEXT,        -- JSON; NULL = ChangeValue.none
            new       TEXT,
            state     TEXT NOT NULL
        );
        CREATE INDEX events_by_operation ON events(operation);

        CREATE TABLE idempotency (
            scope      TEXT PRIMARY KEY NOT NULL,
            body_hash  TEXT NOT NULL,
            status     INTEGER NOT NULL,
            headers    TEXT NOT NULL,   -- JSON [[name, value], ...]
            body       BLOB NOT NULL,
            created_at INTEGER NOT NULL
        );
        CREATE INDEX idempotency_by_time ON idempotency(created_at);

        CREATE TABLE meta (
            key   TEXT PRIMARY KEY NOT NULL,
            value
        ) WITHOUT ROWID;
        """,
        // 1 -> 2: when a cascade cancelled the operation (OperationSnapshot.cascadeAt), ns.
        "ALTER TABLE operations ADD COLUMN cascade_at INTEGER;",
        // 2 -> 3: flow control (API.md "Flow control"). A queue's rate (both columns or
        // neither) and fairness weights; an operation's limits and fairness key, as given; and
        // the limiters. Rows written before have none of them (NULL), which is what they mean.
        """
        ALTER TABLE queues ADD COLUMN rate_per_second REAL;
        ALTER TABLE queues ADD COLUMN rate_burst INTEGER;
        ALTER TABLE queues ADD COLUMN fairness_weights TEXT;   -- JSON {"key": weight}; NULL = none
        ALTER TABLE operations ADD COLUMN limits TEXT;         -- JSON [{"limiter","key"}]; NULL = none
        ALTER TABLE operations ADD COLUMN fairness_key TEXT;
        CREATE TABLE limiters (
            name            TEXT PRIMARY KEY NOT NULL,
            concurrency     INTEGER,
            rate_per_second REAL,
            rate_burst      INTEGER,
            overrides       TEXT,                  -- JSON {"key": {"concurrency"?, "rate"?: {"perSecond","burst"}}}; NULL = none
            created_at      INTEGER NOT NULL,
            revision        INTEGER NOT NULL
        ) WITHOUT ROWID;
        """,
        // 3 -> 4: the hosts' circuit breakers (API.md "Hosts"): an open host comes back open.
        """
        CREATE TABLE hosts (
            host                 TEXT PRIMARY KEY NOT NULL,  -- host:port, lowercase
            state                TEXT NOT NULL,              -- closed, open, halfOpen, ramping
            consecutive_failures INTEGER NOT NULL,
            opened_at            INTEGER,                    -- ns
            until                INTEGER,                    -- ns
            throttled_until      INTEGER,                    -- ns
            last_error           TEXT,                       -- JSON {"type","detail"}
            manual_breaker       TEXT,                       -- open, closed; NULL = automatic
            manual_until         INTEGER,                    -- ns
            manual_reason        TEXT,
            reopenings           INTEGER NOT NULL,
            revision             INTEGER NOT NULL
        ) WITHOUT ROWID;
        """,
        // 4 -> 5: schedules (API.md "Schedules"), and the schedule run an operation is (both
        // columns or neither). A schedule's row is written in the commit of its runs: its
        // cursor (last_nominal) and the run's operation are durable together.
        """
        ALTER TABLE operations ADD COLUMN schedule_name TEXT;
        ALTER TABLE operations ADD COLUMN schedule_nominal INTEGER;   -- ns
        CREATE TABLE schedules (
            queue              TEXT NOT NULL,
            name               TEXT NOT NULL,
            settings           TEXT NOT NULL,   -- JSON (StoreKit.ScheduleText)
            created_at         INTEGER NOT NULL,
            revision           INTEGER NOT NULL,
            is_paused          INTEGER NOT NULL,
            paused_note        TEXT,
            last_nominal       INTEGER,         -- ns
            last_run_nominal   INTEGER,         -- ns
            last_run_operation INTEGER,
            runs               INTEGER NOT NULL,
            skipped            INTEGER NOT NULL,
            missed             INTEGER NOT NULL,
            PRIMARY KEY (queue, name)
        ) WITHOUT ROWID;
        """,
        // 5 -> 6: the admission key an operation was created with (API.md "Admission"), so that
        // a restart knows which operation stands for each debounce and singleton key.
        """
        ALTER TABLE operations ADD COLUMN admission TEXT;   -- `debounce <since ns> <key>` or `singleton <key>`
        """,
        // 6 -> 7: the queues' history (API.md "History"): a bucket per queue, step and slot of
        // its ring, so a queue's rows are bounded whatever its traffic.
        """
        CREATE TABLE history (
            queue TEXT NOT NULL,
            step  INTEGER NOT NULL,   -- 60 or 3600
            slot  INTEGER NOT NULL,   -- start / step modulo the ring's size
            start INTEGER NOT NULL,   -- seconds
            data  TEXT NOT NULL,      -- StoreKit.HistoryText
            PRIMARY KEY (queue, step, slot)
        ) WITHOUT ROWID;
        """,
    ]

    static let operationColumns = """
        id, queue, name, kind, spec, priority, state, outcome, is_cancelled, dependencies, \
        progress_completed, progress_total, attempt, result, error, created_at, started_at, finished_at, \
        revision, timeout, retry, not_before, executed_seconds, kind_state, cascade_at, limits, fairness_key, schedule_name, \
        schedule_nominal, admission
        """
    static let eventColumns = "seq, time, queue, operation, key, old, new, state"
    static let queueColumns = "name, max_concurrent, effective_max, is_suspended, revision, created_at, rate_per_second, rate_burst, fairness_weights"
    static let limiterColumns = "name, concurrency, rate_per_second, rate_burst, overrides, created_at, revision"
    static let idempotencyColumns = "scope, body_hash, status, headers, body, created_at"
    static let hostColumns = HostText.columns.joined(separator: ", ")
    static let scheduleColumns = """
        queue, name, settings, created_at, revision, is_paused, paused_note, last_nominal, last_run_nominal, last_run_operation, runs, \
        skipped, missed
        """

    static func placeholders(_ n: Int) -> String { (1...n).map { "?\($0)" }.joined(separator: ", ") }

    // An upsert updates the row in place; OR REPLACE would delete and re-insert it (and its
    // index entries), which also needs a statement journal.
    static let upsertOperation = """
        INSERT INTO operations (\(operationColumns)) VALUES (\(placeholders(30))) ON CONFLICT (id) DO UPDATE SET \(updateAll(operationColumns))
        """

    /// `a = excluded.a, b = excluded.b, ...` for every column but the first (the key).
    static func updateAll(_ columns: String) -> String {
        columns.split(separator: ",").dropFirst().map { $0.trimmingCharacters() }.map { "\($0) = excluded.\($0)" }.joined(separator: ", ")
    }
    static let upsertQueue = "INSERT OR REPLACE INTO queues (\(queueColumns)) VALUES (\(placeholders(9)))"
    static let upsertLimiter = "INSERT OR REPLACE INTO limiters (\(limiterColumns)) VALUES (\(placeholders(7)))"
    static let deleteLimiter = "DELETE FROM limiters WHERE name = ?1"
    static let upsertSchedule = "INSERT OR REPLACE INTO schedules (\(scheduleColumns)) VALUES (\(placeholders(13)))"
    static let deleteSchedule = "DELETE FROM schedules WHERE queue = ?1 AND name = ?2"
    static let deleteQueueSchedules = "DELETE FROM schedules WHERE queue = ?1"
    static let upsertHistory = "INSERT OR REPLACE INTO history (queue, step, slot, start, data) VALUES (?1, ?2, ?3, ?4, ?5)"
    static let deleteQueueHistory = "DELETE FROM history WHERE queue = ?1"
    static let upsertHost = "INSERT OR REPLACE INTO hosts (\(hostColumns)) VALUES (\(placeholders(12)))"
    /// Hosts' breaker events (operation 0) older than the retention, with the finished operations'.
    static let deleteOldHostEvents = "DELETE FROM events WHERE operation = 0 AND time < ?1"
    // Plain INSERT: OR REPLACE costs a statement journal per row (about a microsecond).
    static let insertEvent = "INSERT INTO events (\(eventColumns)) VALUES (\(placeholders(8)))"
    /// For the rare batch that repeats a seq (an engine that was not restored): the newer wins.
    static let replaceEvent = "INSERT OR REPLACE INTO events (\(eventColumns)) VALUES (\(placeholders(8)))"
    static let upsertIdempotency = "INSERT OR REPLACE INTO idempotency (\(idempotencyColumns)) VALUES (\(placeholders(6)))"
    static let setLastSeq = "INSERT OR REPLACE INTO meta (key, value) VALUES ('last_seq', ?1)"
    // Events go first, while the operations still say which ones belong to the queue.
    static let deleteQueueEvents = "DELETE FROM events WHERE operation IN (SELECT id FROM operations WHERE queue = ?1)"
    static let deleteQueueOperations = "DELETE FROM operations WHERE queue = ?1"
    static let deleteQueue = "DELETE FROM queues WHERE name = ?1"
    // The literal `state = 'finished'` lets SQLite use the partial index.
    static let selectPurgeable = "SELECT id FROM operations WHERE state = 'finished' AND finished_at < ?1 ORDER BY finished_at LIMIT ?2"
    static let deleteOperationEvents = "DELETE FROM events WHERE operation = ?1"
    static let deleteOperation = "DELETE FROM operations WHERE id = ?1"
    /// The newest seq ever written: kept in `meta` because purging events may delete it.
    static let lastSeq = """
        SELECT max(coalesce((SELECT value FROM meta WHERE key = 'last_seq'), 0), coalesce((SELECT max(seq) FROM events), 0))
        """
    static let deleteOldIdempotency = "DELETE FROM idempotency WHERE created_at < ?1"
}

extension Substring {
    /// Without surrounding spaces and newlines.
    func trimmingCharacters() -> String {
        String(drop { $0 == " " || $0 == "\n" }.reversed().drop { $0 == " " || $0 == "\n" }.reversed())
    }
}
