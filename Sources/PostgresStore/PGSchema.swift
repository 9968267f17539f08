import QueueEngine
import StoreKit

/// The store's tables in PostgreSQL, all in the schema `opqd`, and how an older schema is brought
/// up to date.
///
/// `opqd.schema_version` holds the version; version N+1 is reached from N by `migrations[N]`,
/// all missing ones in one transaction at start. An opqd that finds a newer version than it
/// knows refuses to start (as with SQLite's `user_version`).
///
/// Columns follow the SQLite store's, with PostgreSQL types: ids, seqs, revisions and times
/// (ns since the Unix epoch) are `bigint`; dependencies a `bigint[]`; JSON values `text`, not
/// `jsonb`, because jsonb reorders object keys and the API gives back what it was given.
/// Strings that come from clients unchecked (an operation's name, an idempotency scope, meta
/// keys and values) are `bytea`: PostgreSQL's `text` cannot hold U+0000, which a JSON string
/// can, and a row the server refuses would stall the writer forever.
///
/// Clustering (CLUSTER.md): `instance` lists live instances, `ownership` holds the leases with
/// their epochs (scope `p<n>` per partition of queues, the default; scope `*` when one owner
/// runs every queue, `--ownership one`), and `opqd.fence` checks the lease inside each of the
/// holder's commits. Event seqs come from
/// the sequence `event_seq` inside each commit (`lockEvents`, `insertEvents`), and
/// `commit_mark` keeps a retried batch from being committed twice (`opqd.mark`).
package enum PGSchema {
    /// The version this build writes.
    static var version: Int { migrations.count }

    /// The session-level advisory lock that keeps a second opqd off the database (`opqd` in ASCII).
    static let instanceLock: Int64 = 0x6F70_7164

    static let migrations: [String] = [
        // 0 -> 1: the first schema.
        """
        CREATE TABLE opqd.queues (
            name           text PRIMARY KEY,
            max_concurrent bigint NOT NULL,
            effective_max  bigint NOT NULL,
            is_suspended   boolean NOT NULL,
            revision       bigint NOT NULL,
            created_at     bigint NOT NULL
        );
        CREATE TABLE opqd.operations (
            id                 bigint PRIMARY KEY,
            queue              text NOT NULL,
            name               bytea,
            kind               text NOT NULL,
            spec               text,
            priority           integer NOT NULL,
            state              text NOT NULL,
            outcome            text,
            is_cancelled       boolean NOT NULL,
            dependencies       bigint[] NOT NULL,
            progress_completed double precision,
            progress_total     double precision,
            attempt            bigint NOT NULL,
            result             text,
            error              text,
            created_at         bigint NOT NULL,
            started_at         bigint,
            finished_at        bigint,
            revision           bigint NOT NULL,
            timeout            double precision,
            retry              text,
            not_before         bigint,
            executed_seconds   double precision NOT NULL,
            kind_state         text
        );
        CREATE INDEX operations_by_queue ON opqd.operations (queue);
        CREATE INDEX operations_finished ON opqd.operations (finished_at) WHERE state = 'finished';
        CREATE TABLE opqd.events (
            seq       bigint PRIMARY KEY,
            time      bigint NOT NULL,
            queue     text NOT NULL,
            operation bigint NOT NULL,
            key       text NOT NULL,
            old       text,
            new       text,
            state     text NOT NULL
        );
        CREATE INDEX events_by_operation ON opqd.events (operation, seq);
        CREATE TABLE opqd.idempotency (
            scope      bytea PRIMARY KEY,
            body_hash  text NOT NULL,
            status     bigint NOT NULL,
            headers    text NOT NULL,
            body       bytea NOT NULL,
            created_at bigint NOT NULL
        );
        CREATE INDEX idempotency_by_time ON opqd.idempotency (created_at);
        CREATE TABLE opqd.meta (
            key   bytea PRIMARY KEY,
            value bytea NOT NULL
        );
        """,
        // 1 -> 2: instances, the ownership lease that fences every owner's commit, and the
        // epoch each event was written under (so a fenced owner's absence can be checked).
        // Run as one script (`runScript`): the function's body holds semicolons.
        """
        CREATE TABLE opqd.instance (
            id           text PRIMARY KEY,
            url          text NOT NULL,
            started_at   timestamptz NOT NULL,
            heartbeat_at timestamptz NOT NULL
        );
        CREATE TABLE opqd.ownership (
            scope      text PRIMARY KEY,
            instance   text NOT NULL,
            epoch      bigint NOT NULL,
            expires_at timestamptz NOT NULL,
            token      text NOT NULL
        );
        ALTER TABLE opqd.events ADD COLUMN epoch bigint;
        CREATE FUNCTION opqd.fence(who text, held bigint) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM 1 FROM opqd.ownership WHERE scope = '*' AND instance = who AND epoch = held FOR SHARE;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'opqd instance % no longer owns the queues (epoch %)', who, held USING ERRCODE = 'OP001';
            END IF;
        END $$;
        """,
        // 2 -> 3: seq from a sequence inside the commit, so that several writers (owners)
        // commit events with one global seq (see `insertEvents`; every writer moves it past the
        // seqs handed out before it starts, `settleEventSeq`); and one mark per writer, so that
        // a batch whose COMMIT's answer was lost is not committed twice (`opqd.mark`, whose
        // `ticket` is the writer's batch number). Run as one script (function body).
        """
        CREATE SEQUENCE opqd.event_seq AS bigint MINVALUE 1 CACHE 1;
        CREATE TABLE opqd.commit_mark (
            writer text PRIMARY KEY,
            ticket bigint NOT NULL,
            at     timestamptz NOT NULL
        );
        CREATE FUNCTION opqd.mark(who text, upto bigint) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO opqd.commit_mark AS m (writer, ticket, at) VALUES (who, upto, now())
                ON CONFLICT (writer) DO UPDATE SET ticket = excluded.ticket, at = excluded.at WHERE m.ticket < excluded.ticket;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'opqd writer % committed ticket % already', who, upto USING ERRCODE = 'OP002';
            END IF;
        END $$;
        """,
        // 3 -> 4: queues spread over instances by partition (`QueuePartitions`): a lease row per
        // partition (scope `p<n>`) and `opqd.fence_parts`, which checks inside a commit every
        // partition it writes to; and blocks of operation ids (`opqd.id_block`: block b is the
        // ids b * 2^24 ..< (b + 1) * 2^24), so that owners never hand out the same id. Run as
        // one script (function body).
        """
        CREATE FUNCTION opqd.fence_parts(who text, parts text[], epochs bigint[]) RETURNS void LANGUAGE plpgsql AS $$
        DECLARE
            held integer;
        BEGIN
            SELECT count(*) INTO held FROM (
                SELECT 1 FROM opqd.ownership o JOIN unnest(parts, epochs) AS h(scope, epoch) ON o.scope = h.scope AND o.epoch = h.epoch
                WHERE o.instance = who FOR SHARE OF o) AS x;
            IF held <> coalesce(cardinality(parts), 0) THEN
                RAISE EXCEPTION 'opqd instance % no longer owns every partition of %', who, parts USING ERRCODE = 'OP001';
            END IF;
        END $$;
        CREATE SEQUENCE opqd.id_block AS bigint MINVALUE 1;
        """,
        // 4 -> 5: a queue's row holds its whole status, written by every commit that moves its
        // revision (counts per state, operationCount) and the generation that made the revision,
        // so that any instance answers GET /v1/queues[/{name}] from it as the owner would, ETag
        // included. Rows of an older schema get zeros until their owner's first commit, which
        // writes every queue it restored.
        """
        ALTER TABLE opqd.queues ADD COLUMN generation bigint NOT NULL DEFAULT 0,
            ADD COLUMN operation_count bigint NOT NULL DEFAULT 0, ADD COLUMN count_pending bigint NOT NULL DEFAULT 0,
            ADD COLUMN count_ready bigint NOT NULL DEFAULT 0, ADD COLUMN count_executing bigint NOT NULL DEFAULT 0,
            ADD COLUMN count_paused bigint NOT NULL DEFAULT 0, ADD COLUMN count_finished bigint NOT NULL DEFAULT 0;
        """,
        // 5 -> 6: when a cascade cancelled the operation (OperationSnapshot.cascadeAt), ns: the
        // instance holding a dependent reads it to cancel that one too. Whether a lease was
        // given up (`release`) rather than left to run out: the next owner of a partition whose
        // holder stopped uncleanly counts that stop for the operations it was running (API.md
        // "Crashes").
        """
        ALTER TABLE opqd.operations ADD COLUMN cascade_at bigint;
        ALTER TABLE opqd.ownership ADD COLUMN released boolean NOT NULL DEFAULT true;
        ALTER TABLE opqd.ownership ALTER COLUMN released SET DEFAULT false;
        """,
        // 6 -> 7: the partition of the change a kept answer came with (NULL: none, or kept
        // before this version), so that an instance taking partitions reads the answers kept for
        // their queues only, not every one.
        """
        ALTER TABLE opqd.idempotency ADD COLUMN part integer;
        CREATE INDEX idempotency_by_part ON opqd.idempotency (part);
        """,
        // 7 -> 8: updates that leave the indexed columns alone are heap-only (HOT: no new index
        // entries, less WAL): an operation's start and its claim change `state` and
        // `kind_state`, which no index names any more (the purge's index is on `finished_at`,
        // set once, at the end); its pages and the queues' keep room for the new versions.
        """
        DROP INDEX opqd.operations_finished;
        CREATE INDEX operations_finished ON opqd.operations (finished_at) WHERE finished_at IS NOT NULL;
        ALTER TABLE opqd.operations SET (fillfactor = 85);
        ALTER TABLE opqd.queues SET (fillfactor = 50);
        """,
        // 8 -> 9: batches across instances (`PostgresStore+Batches`). A batch's outcome is the
        // row that wins `id`: 'commit', written by the instance that decides it with its whole
        // body and the ids its owners set aside, fenced by each owner's partitions, and with one
        // row per partition in `batch_parts` (its ids) until that partition's owner has added its
        // part; or 'abort', written by an owner that stopped waiting for the decision. `idem`:
        // the Idempotency-Key's scope a batch was made under (one committed batch per key).
        """
        CREATE TABLE opqd.batches (id text PRIMARY KEY, outcome text NOT NULL, decided_at timestamptz NOT NULL DEFAULT now(),
            idem text, body_hash bytea, body bytea, ids bigint[]);
        CREATE UNIQUE INDEX batches_idem ON opqd.batches (idem) WHERE idem IS NOT NULL;
        CREATE INDEX batches_decided ON opqd.batches (decided_at);
        CREATE TABLE opqd.batch_parts (batch text NOT NULL, part integer NOT NULL, ids bigint[] NOT NULL, PRIMARY KEY (batch, part));
        CREATE INDEX batch_parts_by_part ON opqd.batch_parts (part);
        """,
        // 9 -> 10: flow control (API.md "Flow control"), as the SQLite store keeps it: a queue's
        // rate (both columns or neither) and fairness weights (JSON), an operation's limits
        // (JSON) and fairness key (bytea: a client's string), and the limiters. Limiters belong
        // to no queue, so to no partition: one global table, written by whichever instance
        // made the change (`PGWriter` fences such a commit like one of meta alone), and read
        // whole by every instance that restores or takes partitions. Rows written before have
        // none of them (NULL), which is what they mean.
        """
        ALTER TABLE opqd.queues ADD COLUMN rate_per_second double precision, ADD COLUMN rate_burst bigint,
            ADD COLUMN fairness_weights text;
        ALTER TABLE opqd.operations ADD COLUMN limits text, ADD COLUMN fairness_key bytea;
        CREATE TABLE opqd.limiters (
            name            text PRIMARY KEY,
            concurrency     bigint,
            rate_per_second double precision,
            rate_burst      bigint,
            overrides       text,
            created_at      bigint NOT NULL,
            revision        bigint NOT NULL
        );
        """,
        // 10 -> 11: limiters' budgets shared by the instances of a cluster (API.md "Flow control":
        // one budget for the whole cluster). The budget lives here; each instance leases slots and
        // tokens of a key in small batches (`PGLimiterLeases`) and starts operations within them.
        // `limiter_buckets`: a key's token bucket (tokens, when last refilled, ns by the database's
        // clock, and the rate it was filled under: a bucket whose rate changed starts full, as the
        // engine's do); its row is also the key's lock, so every key that was exchanged has one.
        // `limiter_slots`: the slots each instance holds for a key, until `expires_at` (ns): the
        // rows of a crashed instance stop counting when their lease runs out. Keys are `bytea`:
        // a client's string. `opqd.limiter_exchange` does one key's exchange (see `PGLimiterLeases`
        // for the protocol) with a limiter's settings as `opqd.read_limiter` reads them once per
        // statement (its overrides' JSON parsed once, not once per key), and `opqd.limiter_budget`
        // merges a key's override; both refuse a row opqd could not have written (state
        // 'damaged', with the reason) rather than fail the transaction of every key.
        // PostgreSQL's JSON cannot hold U+0000, which an override's key can: `\u0000` in the
        // document and NUL in the key are both read as U+FFFD for the lookup. Run as one script.
        #"""
        CREATE TABLE opqd.limiter_buckets (
            limiter         text NOT NULL,
            key             bytea NOT NULL,
            tokens          double precision NOT NULL,
            refilled_at     bigint NOT NULL,
            rate_per_second double precision,
            rate_burst      bigint,
            PRIMARY KEY (limiter, key)
        );
        CREATE TABLE opqd.limiter_slots (
            limiter    text NOT NULL,
            key        bytea NOT NULL,
            instance   text NOT NULL,
            slots      integer NOT NULL,
            expires_at bigint NOT NULL,
            PRIMARY KEY (limiter, key, instance)
        );
        CREATE INDEX limiter_slots_by_instance ON opqd.limiter_slots (instance);
        CREATE FUNCTION opqd.clock_ns() RETURNS bigint LANGUAGE sql VOLATILE AS $$
            SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint
        $$;
        CREATE TYPE opqd.limiter_settings AS (state text, detail text, concurrency bigint, per_second double precision,
            burst bigint, overrides jsonb);
        -- A limiter's row, checked, its overrides parsed (once per exchange, however many keys):
        -- state 'ok', 'missing' (no such limiter) or 'damaged' (detail says why).
        CREATE FUNCTION opqd.read_limiter(lim text) RETURNS opqd.limiter_settings LANGUAGE plpgsql AS $$
        DECLARE
            l opqd.limiters%ROWTYPE;
            s opqd.limiter_settings;
            doc text;
        BEGIN
            SELECT * INTO l FROM opqd.limiters li WHERE li.name = lim;
            IF NOT FOUND THEN
                s.state := 'missing';
                RETURN s;
            END IF;
            s.state := 'damaged';
            IF l.concurrency IS NOT NULL AND l.concurrency NOT BETWEEN 1 AND 1000000000 THEN
                s.detail := format('column concurrency is %s', l.concurrency);
            ELSIF (l.rate_per_second IS NULL) <> (l.rate_burst IS NULL) THEN
                s.detail := 'columns rate_per_second and rate_burst are not both set';
            -- NaN is above every number in PostgreSQL: refused here too.
            ELSIF l.rate_per_second IS NOT NULL AND NOT (l.rate_per_second BETWEEN 0.001 AND 100000) THEN
                s.detail := format('column rate_per_second is %s, not from 0.001 to 100000', l.rate_per_second);
            ELSIF l.rate_burst IS NOT NULL AND l.rate_burst NOT BETWEEN 1 AND 1000000000 THEN
                s.detail := format('column rate_burst is %s, not from 1 to 1000000000', l.rate_burst);
            ELSIF l.concurrency IS NULL AND l.rate_per_second IS NULL THEN
                s.detail := 'columns concurrency and rate_per_second are both NULL';
            END IF;
            IF s.detail IS NOT NULL THEN
                RETURN s;
            END IF;
            IF l.overrides IS NOT NULL THEN
                -- \u0000 (outside an escaped backslash) becomes \ufffd, which jsonb can hold.
                doc := l.overrides;
                IF strpos(doc, '\u0000') > 0 THEN
                    doc := regexp_replace(doc, '(?<!\\)((?:\\\\)*)\\u0000', '\1\\ufffd', 'g');
                END IF;
                BEGIN
                    s.overrides := doc::jsonb;
                EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
                    s.detail := 'column overrides is not JSON: ' || SQLERRM;
                    RETURN s;
                END;
                IF jsonb_typeof(s.overrides) <> 'object' THEN
                    s.detail := 'column overrides is not a JSON object';
                    s.overrides := NULL;
                    RETURN s;
                END IF;
            END IF;
            s.state := 'ok';
            s.concurrency := l.concurrency;
            s.per_second := l.rate_per_second;
            s.burst := l.rate_burst;
            RETURN s;
        END $$;
        -- Key k's budget under settings s: an override's fields replace the limiter's. State and
        -- detail as read_limiter's; an override opqd could not have written is 'damaged'.
        CREATE FUNCTION opqd.limiter_budget(s opqd.limiter_settings, k bytea, OUT b_state text, OUT b_detail text,
            OUT b_concurrency bigint, OUT b_per_second double precision, OUT b_burst bigint) LANGUAGE plpgsql AS $$
        DECLARE
            o jsonb;
            v jsonb;
            n numeric;
            ps numeric;
            lookup bytea := k;
            p integer;
            shown text;
        BEGIN
            b_state := s.state;
            b_detail := s.detail;
            IF s.state IS DISTINCT FROM 'ok' THEN
                RETURN;
            END IF;
            b_concurrency := s.concurrency;
            b_per_second := s.per_second;
            b_burst := s.burst;
            IF s.overrides IS NULL THEN
                RETURN;
            END IF;
            -- NUL is read as U+FFFD, as in the document (text cannot hold NUL).
            LOOP
                p := position('\x00'::bytea IN lookup);
                EXIT WHEN p = 0;
                lookup := overlay(lookup PLACING '\xefbfbd'::bytea FROM p FOR 1);
            END LOOP;
            shown := convert_from(lookup, 'UTF8');
            o := s.overrides -> shown;
            IF o IS NULL THEN
                RETURN;
            END IF;
            b_state := 'damaged';
            shown := to_json(shown)::text;
            IF jsonb_typeof(o) <> 'object' THEN
                b_detail := format('column overrides has no budget for %s', shown);
                RETURN;
            END IF;
            IF o -> 'concurrency' IS NULL AND o -> 'rate' IS NULL THEN
                b_detail := format('column overrides names neither concurrency nor rate for %s', shown);
                RETURN;
            END IF;
            v := o -> 'concurrency';
            IF v IS NOT NULL THEN
                -- Compared as numeric before any cast: no value can make this function fail.
                IF jsonb_typeof(v) <> 'number' THEN
                    b_detail := format('column overrides has concurrency %s for %s', v, shown);
                    RETURN;
                END IF;
                n := v::numeric;
                IF n <> trunc(n) OR n NOT BETWEEN 1 AND 1000000000 THEN
                    b_detail := format('column overrides has concurrency %s for %s', v, shown);
                    RETURN;
                END IF;
                b_concurrency := n::bigint;
            END IF;
            v := o -> 'rate';
            IF v IS NOT NULL THEN
                IF jsonb_typeof(v) <> 'object' OR jsonb_typeof(v -> 'perSecond') IS DISTINCT FROM 'number'
                    OR jsonb_typeof(v -> 'burst') IS DISTINCT FROM 'number' THEN
                    b_detail := format('column overrides has a rate without perSecond and burst for %s', shown);
                    RETURN;
                END IF;
                ps := (v -> 'perSecond')::numeric;
                n := (v -> 'burst')::numeric;
                IF ps NOT BETWEEN 0.001 AND 100000 OR n <> trunc(n) OR n NOT BETWEEN 1 AND 1000000000 THEN
                    b_detail := format('column overrides has rate %s for %s', v, shown);
                    RETURN;
                END IF;
                b_per_second := ps::double precision;
                b_burst := n::bigint;
            END IF;
            b_state := 'ok';
        END $$;
        -- One key's exchange for instance `who` (see PGLimiterLeases): at most keep + want slots
        -- beside the other instances' live ones, until now + lease_ns; up to want_tokens tokens.
        -- s: read_limiter(lim), read once per statement. Keys of one transaction must be taken
        -- in one order (limiter, then key, bytewise): their bucket rows are locked to the end.
        CREATE FUNCTION opqd.limiter_exchange(who text, lim text, k bytea, keep bigint, want bigint, want_tokens bigint,
            lease_ns bigint, s opqd.limiter_settings,
            OUT g_slots bigint, OUT g_tokens bigint, OUT g_concurrency bigint, OUT g_per_second double precision, OUT g_burst bigint,
            OUT g_bucket double precision, OUT g_state text, OUT g_detail text) LANGUAGE plpgsql AS $$
        DECLARE
            b record;
            now_ns bigint;
            used bigint;
            dead bigint;
            t double precision;
            tries integer := 0;
        BEGIN
            SELECT * INTO g_state, g_detail, g_concurrency, g_per_second, g_burst FROM opqd.limiter_budget(s, k);
            IF g_state IS DISTINCT FROM 'ok' THEN
                -- Nothing for a limiter that is gone or unreadable, and what was held goes back.
                g_state := coalesce(g_state, 'missing');
                g_slots := 0;
                g_tokens := 0;
                g_concurrency := NULL;
                g_per_second := NULL;
                g_burst := NULL;
                DELETE FROM opqd.limiter_slots x WHERE x.limiter = lim AND x.key = k AND x.instance = who;
                RETURN;
            END IF;
            -- The key's lock: its bucket row, made (full) on its first exchange.
            LOOP
                SELECT lb.tokens, lb.refilled_at, lb.rate_per_second, lb.rate_burst INTO b
                    FROM opqd.limiter_buckets lb WHERE lb.limiter = lim AND lb.key = k FOR UPDATE;
                EXIT WHEN FOUND;
                tries := tries + 1;
                IF tries > 3 THEN
                    RAISE EXCEPTION 'opqd.limiter_exchange: the row of limiter % key % keeps vanishing', lim, k;
                END IF;
                INSERT INTO opqd.limiter_buckets (limiter, key, tokens, refilled_at, rate_per_second, rate_burst)
                    VALUES (lim, k, coalesce(g_burst, 0), opqd.clock_ns(), g_per_second, g_burst) ON CONFLICT DO NOTHING;
            END LOOP;
            now_ns := opqd.clock_ns();
            IF g_concurrency IS NULL THEN
                DELETE FROM opqd.limiter_slots x WHERE x.limiter = lim AND x.key = k AND x.instance = who;
                g_slots := 1000000000;
            ELSE
                -- The others' rows are locked too: a renewal under way (which does not take the
                -- key's lock) finishes first and is counted, or finds the expired row deleted.
                SELECT coalesce(sum(greatest(x.slots, 0)) FILTER (WHERE x.expires_at > now_ns), 0),
                       count(*) FILTER (WHERE x.expires_at <= now_ns)
                    INTO used, dead
                    FROM (SELECT o.slots, o.expires_at FROM opqd.limiter_slots o
                          WHERE o.limiter = lim AND o.key = k AND o.instance <> who FOR UPDATE) x;
                IF dead > 0 THEN
                    DELETE FROM opqd.limiter_slots x WHERE x.limiter = lim AND x.key = k AND x.instance <> who AND x.expires_at <= now_ns;
                END IF;
                g_slots := greatest(0, least(keep + want, g_concurrency - used));
                IF g_slots = 0 THEN
                    DELETE FROM opqd.limiter_slots x WHERE x.limiter = lim AND x.key = k AND x.instance = who;
                ELSE
                    INSERT INTO opqd.limiter_slots AS x (limiter, key, instance, slots, expires_at) VALUES (lim, k, who, g_slots, now_ns + lease_ns)
                        ON CONFLICT (limiter, key, instance) DO UPDATE SET slots = excluded.slots, expires_at = excluded.expires_at;
                END IF;
            END IF;
            IF g_per_second IS NULL THEN
                g_tokens := want_tokens;
                IF b.rate_per_second IS NOT NULL OR b.rate_burst IS NOT NULL THEN
                    UPDATE opqd.limiter_buckets lb SET tokens = 0, refilled_at = now_ns, rate_per_second = NULL, rate_burst = NULL
                        WHERE lb.limiter = lim AND lb.key = k;
                END IF;
            ELSE
                IF b.rate_per_second IS DISTINCT FROM g_per_second OR b.rate_burst IS DISTINCT FROM g_burst THEN
                    -- A new rate (or the first): the bucket starts full, as the engine's do.
                    t := g_burst;
                ELSE
                    -- A row edited by hand: NaN or below 0 holds nothing, a refill time ahead
                    -- adds nothing (both heal with this exchange's write).
                    t := b.tokens;
                    IF t = 'NaN'::double precision OR t < 0 THEN
                        t := 0;
                    END IF;
                    t := least(g_burst::double precision,
                        t + greatest(0, now_ns::double precision - b.refilled_at::double precision) / 1e9 * g_per_second);
                END IF;
                g_tokens := least(floor(t), want_tokens::double precision)::bigint;
                t := t - g_tokens;
                UPDATE opqd.limiter_buckets lb SET tokens = t, refilled_at = now_ns, rate_per_second = g_per_second, rate_burst = g_burst
                    WHERE lb.limiter = lim AND lb.key = k;
                g_bucket := t;
            END IF;
        END $$;
        """#,
        // 11 -> 12: the hosts' circuit breakers (API.md "Hosts"). Like limiters, a host belongs
        // to no queue: one global table, one row per host, written by whichever instance changed
        // its state (the newest revision wins in every engine that reads it).
        """
        CREATE TABLE opqd.hosts (
            host                 text PRIMARY KEY,
            state                text NOT NULL,
            consecutive_failures bigint NOT NULL,
            opened_at            bigint,
            until                bigint,
            throttled_until      bigint,
            last_error           text,
            manual_breaker       text,
            manual_until         bigint,
            manual_reason        text,
            reopenings           bigint NOT NULL,
            revision             bigint NOT NULL
        );
        """,
        // 12 -> 13: schedules (API.md "Schedules"), kept with their queue's partition: a
        // schedule's row is written in the commit of its runs, fenced like its queue's.
        """
        ALTER TABLE opqd.operations ADD COLUMN schedule_name text, ADD COLUMN schedule_nominal bigint;
        CREATE TABLE opqd.schedules (
            queue              text NOT NULL,
            name               text NOT NULL,
            settings           text NOT NULL,
            created_at         bigint NOT NULL,
            revision           bigint NOT NULL,
            is_paused          boolean NOT NULL,
            paused_note        text,
            last_nominal       bigint,
            last_run_nominal   bigint,
            last_run_operation bigint,
            runs               bigint NOT NULL,
            skipped            bigint NOT NULL,
            missed             bigint NOT NULL,
            PRIMARY KEY (queue, name)
        );
        """,
        // 13 -> 14: the admission key an operation was created with (API.md "Admission"): an
        // instance that takes the queue knows which operation stands for each key.
        """
        ALTER TABLE opqd.operations ADD COLUMN admission text;
        """,
        // 14 -> 15: the queues' history (API.md "History"), kept with the queue's partition (a new
        // owner loads it with the queue): a row per queue, step and slot of its ring.
        """
        CREATE TABLE opqd.history (
            queue text NOT NULL,
            step  bigint NOT NULL,
            slot  bigint NOT NULL,
            start bigint NOT NULL,
            data  text NOT NULL,
            PRIMARY KEY (queue, step, slot)
        );
        """,
    ]

    /// Migrations run whole as one script (`runScript`) rather than split at semicolons.
    static let scriptMigrations: Set<Int> = [1, 2, 3, 10]

    /// The SQLSTATE `opqd.fence` raises: this instance's commit was refused because another
    /// instance took the queues (a higher epoch).
    static let fencedState = "OP001"
    /// First in every fenced transaction: takes a share lock on the ownership row (a takeover
    /// waits for this commit) and aborts the transaction unless the epoch is still ours.
    static let fence = "SELECT opqd.fence($1, $2::bigint)"
    /// The partitioned form of `fence`: every partition the commit writes to (scopes `$2`) at
    /// the epoch this instance won it (`$3`, in the same order).
    static let fenceParts = "SELECT opqd.fence_parts($1, $2::text[], $3::bigint[])"
    /// `fenceParts` satisfied by any one of the partitions (a commit that names none, `meta`):
    /// when this instance holds none of them at the epochs given, `fence_parts` is asked for a
    /// partition nobody has, which refuses the commit the same way (OP001).
    static let fenceAny = """
        SELECT CASE WHEN count(*) = 0 THEN opqd.fence_parts($1, ARRAY['none'], ARRAY[0]::bigint[]) END FROM (\
        SELECT 1 FROM opqd.ownership o JOIN unnest($2::text[], $3::bigint[]) AS h(scope, epoch) ON o.scope = h.scope AND o.epoch = h.epoch \
        WHERE o.instance = $1 FOR SHARE OF o) AS held
        """
    /// The transaction-level advisory lock `takeIDBlock` runs under (`opqd` + 2 in ASCII).
    static let idBlockLock: Int64 = 0x6F70_7166
    /// ids per block (`opqd.id_block`).
    static let idBlockBits: UInt64 = 24
    /// A new block of operation ids, above every id stored (a database whose ids a one-owner
    /// opqd handed out as max + 1 included). Run after `pg_advisory_xact_lock(idBlockLock)`, in
    /// its transaction: the read of max(id) and the move of the sequence are one step for all.
    static let takeIDBlock = """
        SELECT setval('opqd.id_block', greatest(nextval('opqd.id_block'), coalesce((SELECT max(id) FROM opqd.operations), 0) / 16777216 + 1))
        """
    /// Wakes every instance's feed (`PGListener`, which reads what is new: no payload).
    /// The payload names the instance that committed, so that its own listener can ignore it.
    package static let notifyEvents = "SELECT pg_notify('opqd_events', $1)"

    /// Creates the schema and the version table if missing (a first start). Run inside the
    /// migration transaction.
    static let bootstrap = """
        CREATE SCHEMA IF NOT EXISTS opqd;
        CREATE TABLE IF NOT EXISTS opqd.schema_version (version integer NOT NULL);
        """

    static let operationColumns = """
        id, queue, name, kind, spec, priority, state, outcome, is_cancelled, dependencies, \
        progress_completed, progress_total, attempt, result, error, created_at, started_at, finished_at, \
        revision, timeout, retry, not_before, executed_seconds, kind_state, cascade_at, limits, fairness_key, schedule_name, \
        schedule_nominal, admission
        """
    /// The array type each operation column is sent as, in `operationColumns` order.
    static let operationArrayTypes = [
        "bigint[]", "text[]", "bytea[]", "text[]", "text[]", "integer[]", "text[]", "text[]", "boolean[]", "text[]",
        "float8[]", "float8[]", "bigint[]", "text[]", "text[]", "bigint[]", "bigint[]", "bigint[]",
        "bigint[]", "float8[]", "text[]", "bigint[]", "float8[]", "text[]", "bigint[]", "text[]", "bytea[]", "text[]", "bigint[]", "text[]",
    ]
    static let eventColumns = "seq, time, queue, operation, key, old, new, state, epoch"
    static let eventArrayTypes = ["bigint[]", "bigint[]", "text[]", "bigint[]", "text[]", "text[]", "text[]", "text[]", "bigint[]"]
    /// The counts follow `OperationState.allCases` (pending, ready, executing, paused, finished).
    static let queueColumns = """
        name, max_concurrent, effective_max, is_suspended, revision, created_at, generation, operation_count, \
        count_pending, count_ready, count_executing, count_paused, count_finished, rate_per_second, rate_burst, fairness_weights
        """
    static let queueArrayTypes =
        ["text[]", "bigint[]", "bigint[]", "boolean[]", "bigint[]", "bigint[]"] + Array(repeating: "bigint[]", count: 7) + ["float8[]", "bigint[]", "text[]"]
    /// One queue's row (a follower's `GET /v1/queues/{name}`).
    static let selectQueue = "SELECT \(queueColumns) FROM opqd.queues WHERE name = $1"
    /// Every queue's row, in the order the engine lists them (by name, bytewise: names are ASCII).
    static let selectQueues = "SELECT \(queueColumns) FROM opqd.queues ORDER BY name COLLATE \"C\""
    static let idempotencyColumns = "scope, body_hash, status, headers, body, created_at"

    /// `INSERT ... SELECT unnest($1::t1[]), unnest($2::t2[]), ...`: one statement for every row
    /// of a batch, each column one array parameter. The upsert replaces the whole row, as the
    /// SQLite store's does; the caller sends each key at most once per statement (and every
    /// array has one element per row).
    ///
    /// The `unnest`s are in the select list, where they run in lockstep and stream their rows
    /// (ProjectSet), rather than in `FROM unnest(a, b, ...)`, which first copies every row into
    /// a tuplestore: perf put that copy at about a sixth of the writer backend's CPU with
    /// workers claiming and finishing, and the operations' upsert of 600 rows took 20 % less
    /// time this way (an alternating A/B of 40 rounds of one insert and one update each).
    static func bulkUpsert(table: String, columns: String, types: [String], conflict: String, casts: [String: String] = [:]) -> String {
        let names = columns.split(separator: ",").map { $0.trimmingCharacters() }
        let select = zip(names, types).enumerated().map { i, column in
            "unnest($\(i + 1)::\(column.1))" + (casts[column.0].map { "::\($0)" } ?? "")
        }.joined(separator: ", ")
        let update = names.filter { $0 != conflict }.map { "\($0) = excluded.\($0)" }.joined(separator: ", ")
        return """
            INSERT INTO opqd.\(table) (\(columns)) SELECT \(select) \
            ON CONFLICT (\(conflict)) DO UPDATE SET \(update)
            """
    }

    static let upsertOperations = bulkUpsert(
        table: "operations", columns: operationColumns, types: operationArrayTypes, conflict: "id", casts: ["dependencies": "bigint[]"])
    /// The transaction-level advisory lock every commit with events takes right before it
    /// numbers them (`opqd` + 1 in ASCII), held to the end of the commit.
    static let eventLock: Int64 = 0x6F70_7165
    /// Taken right before the first `insertEvents` of a transaction: the writers number their
    /// events one commit at a time, and the lock is released only once the commit is visible,
    /// so seqs become visible in seq order and a feed reader that sees seq N sees every seq
    /// below it (a sequence alone hands values out before commit: two commits could become
    /// visible out of order and a reader skip the earlier). Measured against a counter row
    /// (`opqd-bench feed-order`): as safe, a little faster, and no hot row to vacuum.
    static let lockEvents = "SELECT pg_advisory_xact_lock(\(eventLock)::bigint)"
    /// Events are new rows, numbered here, in the order given (the engine's own seqs, `$1`,
    /// only order them). Answers the newest seq and the count: under the lock the values are
    /// consecutive, so the events got newest - count + 1 ... newest.
    package static let insertEvents = insertEventsStatement(locking: false)
    /// `lockEvents` and `insertEvents` in one statement, for the first numbering of a commit:
    /// the lock (CTE `l`) is taken before the sequence is drawn from, as `t` reads from `l`.
    static let lockAndInsertEvents = insertEventsStatement(locking: true)

    static func insertEventsStatement(locking: Bool) -> String {
        let n = "$\(eventArrayTypes.count + 1)::bigint"
        let lock = locking ? "l AS (\(lockEvents)), " : ""
        let afterLock = locking ? " FROM l" : ""
        // The block is taken in one step (nextval, then setval past the block: nobody else
        // draws while the lock is held) and row n gets top - count + n: no reliance on the order
        // in which the planner would evaluate nextval per row.
        // The rows stream from `unnest`s in the select list, in lockstep with the ordinal
        // (see `bulkUpsert`); `$1`, the engine's seqs, only sets how many there are.
        let values = eventArrayTypes.enumerated().dropFirst().map { "unnest($\($0.offset + 1)::\($0.element))" }.joined(separator: ", ")
        return """
            WITH \(lock)t AS (SELECT setval('opqd.event_seq', nextval('opqd.event_seq') + \(n) - 1) AS top\(afterLock)), \
            i AS (INSERT INTO opqd.events (\(eventColumns)) \
            SELECT t.top - \(n) + generate_series(1::bigint, cardinality($1::\(eventArrayTypes[0]))::bigint), \(values) FROM t) \
            SELECT top FROM t
            """
    }
    /// The first write of every commit with events: moves the writer's mark to the batch's
    /// number, or fails the transaction (SQLSTATE `OP002`) when the mark is there
    /// already, i.e. an earlier attempt at this batch committed although its answer was lost.
    /// The mark's row lock orders the attempts: a retry waits for an attempt still running on
    /// the server, then sees what it did.
    static let markCommit = "SELECT opqd.mark($1, $2::bigint)"
    /// A partition holder's commit with events opens with one statement: `fenceParts` (`$1` the
    /// instance, `$2` and `$3` the partitions and epochs) and `markCommit` (`$4` the writer, `$5`
    /// the batch), evaluated in that order; `fencePartsMarkNotify` adds `notifyEvents` (payload
    /// `$1`; a NOTIFY is sent at commit wherever in the transaction it was asked for).
    static let fencePartsMark = "SELECT opqd.fence_parts($1, $2::text[], $3::bigint[]), opqd.mark($4, $5::bigint)"
    static let fencePartsMarkNotify = "SELECT opqd.fence_parts($1, $2::text[], $3::bigint[]), opqd.mark($4, $5::bigint), pg_notify('opqd_events', $1)"
    static let committedState = "OP002"
    /// At the start of a writer, and after a unique violation on a seq (a database edited by
    /// hand): the sequence past every seq handed out before (an older opqd's `meta last_seq`,
    /// stored events). Run after `lockEvents`, in its transaction.
    static let settleEventSeq = """
        SELECT setval('opqd.event_seq', greatest(1, s.last), s.last > 0) FROM (SELECT greatest(
            coalesce((SELECT max(seq) FROM opqd.events), 0),
            (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM opqd.event_seq),
            coalesce((SELECT CASE WHEN encode(value, 'escape') ~ '^[0-9]{1,18}$' THEN encode(value, 'escape')::bigint END
                      FROM opqd.meta WHERE key = convert_to('last_seq', 'UTF8')), 0)) AS last) AS s
        """
    /// Marks of writers gone for a day (a live writer's mark is only ever read seconds after it
    /// wrote it).
    static let deleteOldMarks = "DELETE FROM opqd.commit_mark WHERE at < now() - interval '1 day'"

    static let upsertQueues = bulkUpsert(table: "queues", columns: queueColumns, types: queueArrayTypes, conflict: "name")
    /// The common commit touches one queue: its row with plain parameters, which the server
    /// parses and plans for less than `unnest` over thirteen one-element arrays.
    static let upsertQueue: String = {
        let names = queueColumns.split(separator: ",").map { $0.trimmingCharacters() }
        let values = queueArrayTypes.enumerated().map { "$\($0.offset + 1)::\($0.element.dropLast(2))" }.joined(separator: ", ")
        let update = names.dropFirst().map { "\($0) = excluded.\($0)" }.joined(separator: ", ")
        return "INSERT INTO opqd.queues (\(names.joined(separator: ", "))) VALUES (\(values)) ON CONFLICT (name) DO UPDATE SET \(update)"
    }()
    /// `upsertQueue`'s parameters, in `queueColumns` order.
    static func queueParameters(_ q: QueueSnapshot) -> [PGParameter] {
        var out = [
            PGParameter(q.name), PGParameter(q.maxConcurrentOperationCount), PGParameter(q.effectiveMaxConcurrentOperationCount),
            PGParameter(q.isSuspended ? "t" : "f"), PGParameter(Int64(bitPattern: q.revision)), PGParameter(q.createdAt.nanoseconds),
            PGParameter(Int64(bitPattern: q.generation)), PGParameter(q.operationCount),
        ]
        for s in OperationState.allCases { out.append(PGParameter(q.counts[s] ?? 0)) }
        out += rateParameters(q.rateLimit)
        if q.fairnessWeights.isEmpty {
            out.append(.null)
        } else {
            var json: [UInt8] = []
            FlowText.writeWeights(q.fairnessWeights, to: &json)
            out.append(PGParameter(bytes: json + [0]))
        }
        return out
    }

    /// A rate as two parameters (per second, burst); NULL in both for none.
    static func rateParameters(_ r: RateLimit?) -> [PGParameter] {
        guard let r else { return [.null, .null] }
        return [PGParameter(String(r.perSecond)), PGParameter(r.burst)]
    }

    static let limiterColumns = "name, concurrency, rate_per_second, rate_burst, overrides, created_at, revision"
    /// Every limiter, whichever instance wrote it (they belong to no partition).
    static let selectLimiters = "SELECT \(limiterColumns) FROM opqd.limiters ORDER BY name"
    static let upsertLimiter = """
        INSERT INTO opqd.limiters (\(limiterColumns)) VALUES ($1, $2::bigint, $3::float8, $4::bigint, $5, $6::bigint, $7::bigint) \
        ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, rate_per_second = excluded.rate_per_second, \
        rate_burst = excluded.rate_burst, overrides = excluded.overrides, created_at = excluded.created_at, revision = excluded.revision
        """
    static let deleteLimiter = "DELETE FROM opqd.limiters WHERE name = $1"
    static let hostColumns = HostText.columns.joined(separator: ", ")
    static let scheduleColumns = """
        queue, name, settings, created_at, revision, is_paused, paused_note, last_nominal, last_run_nominal, last_run_operation, runs, \
        skipped, missed
        """
    static let upsertSchedule = """
        INSERT INTO opqd.schedules (\(scheduleColumns)) VALUES ($1, $2, $3, $4::bigint, $5::bigint, $6::boolean, $7, $8::bigint, $9::bigint, \
        $10::bigint, $11::bigint, $12::bigint, $13::bigint) ON CONFLICT (queue, name) DO UPDATE SET settings = excluded.settings, \
        created_at = excluded.created_at, revision = excluded.revision, is_paused = excluded.is_paused, paused_note = excluded.paused_note, \
        last_nominal = excluded.last_nominal, last_run_nominal = excluded.last_run_nominal, \
        last_run_operation = excluded.last_run_operation, runs = excluded.runs, skipped = excluded.skipped, missed = excluded.missed
        """
    static let deleteSchedule = "DELETE FROM opqd.schedules WHERE queue = $1 AND name = $2"
    static let deleteQueueSchedules = "DELETE FROM opqd.schedules WHERE queue = $1"
    static let upsertHistory = """
        INSERT INTO opqd.history (queue, step, slot, start, data) VALUES ($1, $2::bigint, $3::bigint, $4::bigint, $5) \
        ON CONFLICT (queue, step, slot) DO UPDATE SET start = excluded.start, data = excluded.data
        """
    static let deleteQueueHistory = "DELETE FROM opqd.history WHERE queue = $1"
    static let historyColumns = "queue, step, start, data"
    static func scheduleParameters(_ s: ScheduleSnapshot) -> [PGParameter] {
        func time(_ t: Timestamp?) -> PGParameter { t.map { PGParameter($0.nanoseconds) } ?? .null }
        return [
            PGParameter(s.queue), PGParameter(s.spec.name), PGParameter(bytes: ScheduleText.write(s.spec) + [0]), PGParameter(s.createdAt.nanoseconds),
            PGParameter(Int64(bitPattern: s.revision)), PGParameter(s.isPaused ? "true" : "false"), s.pausedNote.map { PGParameter($0) } ?? .null,
            time(s.lastNominal), time(s.lastRun?.nominalTime), s.lastRun.map { PGParameter(Int64(bitPattern: $0.operation.raw)) } ?? .null,
            PGParameter(Int64(bitPattern: s.runs)), PGParameter(Int64(bitPattern: s.skipped)), PGParameter(Int64(bitPattern: s.missed)),
        ]
    }
    /// Every host, whichever instance wrote it.
    static let selectHosts = "SELECT \(hostColumns) FROM opqd.hosts ORDER BY host"
    static let upsertHost = """
        INSERT INTO opqd.hosts (\(hostColumns)) VALUES ($1, $2, $3::bigint, $4::bigint, $5::bigint, $6::bigint, $7, $8, $9::bigint, $10, \
        $11::bigint, $12::bigint) ON CONFLICT (host) DO UPDATE SET state = excluded.state, \
        consecutive_failures = excluded.consecutive_failures, opened_at = excluded.opened_at, until = excluded.until, \
        throttled_until = excluded.throttled_until, last_error = excluded.last_error, manual_breaker = excluded.manual_breaker, \
        manual_until = excluded.manual_until, manual_reason = excluded.manual_reason, reopenings = excluded.reopenings, \
        revision = excluded.revision
        """
    /// `upsertHost`'s parameters.
    static func hostParameters(_ h: HostSnapshot) -> [PGParameter] {
        func time(_ t: Timestamp?) -> PGParameter { t.map { PGParameter($0.nanoseconds) } ?? .null }
        var lastError = PGParameter.null
        if let e = h.lastError {
            var json: [UInt8] = []
            e.write(to: &json)
            lastError = PGParameter(bytes: json + [0])
        }
        return [
            PGParameter(h.host), PGParameter(h.state.rawValue), PGParameter(h.consecutiveFailures), time(h.openedAt), time(h.until),
            time(h.throttledUntil), lastError, h.manual.map { PGParameter($0.breaker.rawValue) } ?? .null, time(h.manual?.until),
            h.manual?.reason.map { PGParameter($0) } ?? .null, PGParameter(h.reopenings), PGParameter(Int64(bitPattern: h.revision)),
        ]
    }
    /// `upsertLimiter`'s parameters. `running`, `waiting` and `keys` are the engine's to count.
    static func limiterParameters(_ l: LimiterSnapshot) -> [PGParameter] {
        var out = [PGParameter(l.name), l.settings.concurrency.map { PGParameter($0) } ?? .null]
        out += rateParameters(l.settings.rate)
        if l.settings.overrides.isEmpty {
            out.append(.null)
        } else {
            var json: [UInt8] = []
            FlowText.writeOverrides(l.settings.overrides, to: &json)
            out.append(PGParameter(bytes: json + [0]))
        }
        out += [PGParameter(l.createdAt.nanoseconds), PGParameter(Int64(bitPattern: l.revision))]
        return out
    }

    static let upsertIdempotency = """
        INSERT INTO opqd.idempotency (\(idempotencyColumns), part) VALUES ($1::bytea, $2, $3::bigint, $4, $5::bytea, $6::bigint, $7::integer) \
        ON CONFLICT (scope) DO UPDATE SET body_hash = excluded.body_hash, status = excluded.status, headers = excluded.headers, \
        body = excluded.body, created_at = excluded.created_at, part = excluded.part
        """
    // Events go first, while the operations still say which ones belong to the queue.
    static let deleteQueueEvents = "DELETE FROM opqd.events WHERE operation IN (SELECT id FROM opqd.operations WHERE queue = $1)"
    static let deleteQueueOperations = "DELETE FROM opqd.operations WHERE queue = $1"
    static let deleteQueue = "DELETE FROM opqd.queues WHERE name = $1"
    /// Batches decided more than a day ago with no part left to add (or written off).
    static let pruneBatches = """
        DELETE FROM opqd.batches WHERE id IN (SELECT b.id FROM opqd.batches b WHERE b.decided_at < now() - interval '1 day' \
        AND NOT EXISTS (SELECT 1 FROM opqd.batch_parts p WHERE p.batch = b.id) LIMIT 100)
        """
    /// A batch part added (`StoreRecord.batchPartAdded`), in the commit of its operations.
    static let forgetBatchPart = "DELETE FROM opqd.batch_parts WHERE batch = $1 AND part = $2"
    /// Up to $2 operations finished before $1, oldest first, with their events; the count of
    /// operations deleted is the statement's row count.
    static let purge = """
        WITH p AS (SELECT id FROM opqd.operations WHERE state = 'finished' AND finished_at < $1::bigint ORDER BY finished_at LIMIT $2::bigint), \
        e AS (DELETE FROM opqd.events WHERE operation IN (SELECT id FROM p)), \
        h AS (DELETE FROM opqd.events WHERE operation = 0 AND time < $1::bigint) \
        DELETE FROM opqd.operations WHERE id IN (SELECT id FROM p)
        """
    static let deleteOldIdempotency = "DELETE FROM opqd.idempotency WHERE created_at < $1::bigint"
    static let upsertMeta = "INSERT INTO opqd.meta (key, value) VALUES ($1::bytea, $2::bytea) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    static let deleteMeta = "DELETE FROM opqd.meta WHERE key = $1::bytea"
    static let deleteMetaPrefix = "DELETE FROM opqd.meta WHERE substring(key FROM 1 FOR length($1::bytea)) = $1::bytea"
    static let selectMetaPrefix = "SELECT key, value FROM opqd.meta WHERE substring(key FROM 1 FOR length($1::bytea)) = $1::bytea ORDER BY key"
    /// `last_seq` from meta (its bytes; NULL when absent: schema 2 kept the newest seq there) and
    /// the newest seq handed out (the counter, which purging never moves back, or a newer event).
    static let lastSeq = """
        SELECT (SELECT value FROM opqd.meta WHERE key = convert_to('last_seq', 'UTF8')), \
        greatest((SELECT max(seq) FROM opqd.events), (SELECT CASE WHEN is_called THEN last_value END FROM opqd.event_seq))
        """
}

extension Substring {
    /// Without surrounding spaces and newlines.
    func trimmingCharacters() -> String {
        String(drop { $0 == " " || $0 == "\n" }.reversed().drop { $0 == " " || $0 == "\n" }.reversed())
    }
}
