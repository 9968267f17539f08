/// Why the PostgreSQL store could not be opened or used. `description` names the database (its
/// URL without the password) and says what to do, so it can be logged as is and the process can
/// stop: the store never starts empty over data it could not read.
public struct PostgresStoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What went wrong.
    public enum Reason: Sendable, Equatable {
        /// The server could not be reached, or refused the connection (address, credentials, database).
        case cannotConnect
        /// Another opqd holds the database's instance lock.
        case inUse
        /// The database's opqd schema was written by a newer opqd.
        case newerSchema(found: Int, supported: Int)
        /// The schema `opqd` exists but is not one opqd made (no version, or an impossible one).
        case foreignSchema
        /// A row cannot be read back as a value opqd writes.
        case corrupt
        /// A statement failed (permissions, disk full on the server, ...).
        case io
    }

    public let reason: Reason
    /// The database, as `PostgresStore.redact` shows it.
    public let url: String
    /// The underlying message (the server's or libpq's).
    public let detail: String

    public init(_ reason: Reason, url: String, detail: String) {
        self.reason = reason; self.url = url; self.detail = detail
    }

    /// One line: what, where, why, and what to do.
    public var description: String {
        switch reason {
        case .cannotConnect:
            return
                "cannot connect to PostgreSQL at \(url): \(detail). Check that the server is running and reachable, and the user, password and database in --store."
        case .inUse:
            return
                "another opqd instance is using the database \(url) as a store of its own (its instance lock is held); opqd instances share a database only as a cluster (opqd --store URL). Stop the other one, or point --store at another database."
        case let .newerSchema(found, supported):
            return
                "the database \(url) has opqd schema version \(found), but this opqd understands up to \(supported). Run a newer opqd, or restore a backup made by this version."
        case .foreignSchema:
            return "the database \(url) has a schema `opqd` that opqd did not make (\(detail)). Point --store at another database, or drop that schema."
        case .corrupt:
            return "the database \(url) holds opqd data that cannot be read back: \(detail). Restore it from a backup; opqd will not start over damaged data."
        case .io:
            return "the database \(url) could not be read or written: \(detail)."
        }
    }
}
