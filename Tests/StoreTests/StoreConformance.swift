import Foundation
import PostgresStore
import QueueEngine
import StoreKit
import Testing

@testable import SQLiteStore

/// The stores the conformance suite runs on (`@Test(arguments:)`).
enum StoreKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case memory, sqlite, postgres

    /// The two that keep what they commit: every restart scenario runs on both.
    static let durable: [StoreKind] = [.sqlite, .postgres]

    var testDescription: String { rawValue }
}

/// What the scenarios ask of a durable store beyond `DurableStore` and the engine's
/// `OperationStore`: both stores have these under the same names.
protocol StoreUnderTest: DurableStore, OperationStore {
    func load() throws -> RecoveredState
    /// The highest ticket reported durable.
    var durableTicket: UInt64 { get }
    /// The seq of the oldest kept event; one past the newest when none is kept.
    var oldestEventSeq: UInt64 { get }
    var stats: StoreStats { get }
    /// Kept events of one operation, with a failed read answered as none.
    func events(of id: OperationID, after: UInt64, limit: Int) -> [ChangeEvent]
    @discardableResult
    func deleteMeta(prefix: String, then done: (@Sendable () -> Void)?) -> Bool
}

extension SQLiteStore: StoreUnderTest {}
extension PostgresStore: StoreUnderTest {}

/// Where one test's store lives, as River's driver tests give each driver a fresh schema: an
/// empty place of the kind (a directory; a database of its own on the test server,
/// OPQD_TEST_POSTGRES_URL; nothing for memory). The scenario opens its store there, and opens
/// it again for a restart. Every store opened here is closed (close is idempotent) and the
/// place removed when the test ends.
final class StorePlace {
    let kind: StoreKind
    /// The SQLite store's directory, the PostgreSQL database's URL; "" in memory.
    let location: String
    private var opened: [any DurableStore] = []

    init(kind: StoreKind, location: String) {
        self.kind = kind
        self.location = location
    }

    /// Runs `body` on a fresh place of `kind`. The PostgreSQL leg throws without a server
    /// (saying what to set): it never passes silently.
    static func with(_ kind: StoreKind, _ body: (StorePlace) throws -> Void) throws {
        switch kind {
        case .memory:
            try StorePlace(kind: kind, location: "").run(body)
        case .sqlite:
            try withTemporaryDirectory(prefix: "opqd-conformance") { dir in
                // A directory that does not exist yet: the store makes it, and its parents.
                try StorePlace(kind: kind, location: dir.file("nested/deeper")).run(body)
            }
        case .postgres:
            let url = try TestPostgres.createDatabase()
            defer { TestPostgres.dropDatabase(url) }
            try StorePlace(kind: kind, location: url).run(body)
        }
    }

    private func run(_ body: (StorePlace) throws -> Void) throws {
        defer { for store in opened { store.close() } }
        try body(self)
    }

    /// A store on this place: the first finds it empty, a later one what the earlier ones
    /// committed (a restart; in memory, a new empty store, as a restarted process has).
    func open() throws -> any DurableStore {
        let store: any DurableStore
        switch kind {
        case .memory: store = MemoryStore()
        case .sqlite: store = try SQLiteStore(directory: location)
        case .postgres: store = try PostgresStore(url: location)
        }
        opened.append(store)
        return store
    }

    /// `open()` of a durable kind, with what the scenarios ask of it beyond the contract.
    func openDurable() throws -> any StoreUnderTest {
        guard let store = try open() as? any StoreUnderTest else { throw TestClientError("\(kind) is not a durable store") }
        return store
    }

    /// Makes every read of the stored events fail from now on, behind the store's back (the
    /// events table goes away).
    func breakEventReads(of store: any StoreUnderTest) throws {
        switch kind {
        case .memory:
            throw TestClientError("the memory store reads no events")
        case .sqlite:
            let conn = try SQLiteConnection(path: store.path, create: false)
            try conn.execute("ALTER TABLE events RENAME TO events_gone")
            conn.close()
        case .postgres:
            try TestPostgres.psql(location, "ALTER TABLE opqd.events RENAME TO events_gone")
        }
    }
}

extension DurableStore {
    /// Appends `records` through the engine's side of the store and waits until `ticket` is
    /// durable; false when it did not become durable in 10 s.
    func commit(_ records: [StoreRecord], ticket: UInt64) -> Bool {
        engineStore.append(records, upTo: ticket)
        return waitDurable(engineStore, ticket)
    }

    /// `setMeta` and waits until committed; false when refused or not committed in 10 s.
    func commitMeta(_ pairs: [(key: String, value: String?)]) -> Bool {
        let done = DispatchSemaphoreBox()
        guard setMeta(pairs, then: { done.signal() }) else { return false }
        return done.wait(seconds: 10)
    }
}
