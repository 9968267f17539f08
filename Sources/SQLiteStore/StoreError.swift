/// Why the durable store could not be opened or used. `description` names the file and says
/// what to do, so it can be logged as is and the process can stop: the store never starts
/// empty over data it could not read.
public struct StoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What went wrong.
    public enum Reason: Sendable, Equatable {
        /// The store directory is missing and could not be created.
        case cannotCreateDirectory
        /// The store directory path exists but is not a directory.
        case notADirectory
        /// The file or directory cannot be opened (permissions, missing parent, ...).
        case cannotOpen
        /// The file can be read but not written.
        case readOnly
        /// The file is not a SQLite database (wrong header, encrypted, another format).
        case notADatabase
        /// The file is a SQLite database but damaged (`PRAGMA quick_check` failed or a row is unreadable).
        case corrupt
        /// The file was written by a newer opqd.
        case newerSchema(found: Int, supported: Int)
        /// The file is a SQLite database of another program.
        case foreignDatabase
        /// Another process (or another `SQLiteStore` in this one) has the store open.
        case inUse
        /// Reading or writing failed (disk full, I/O error).
        case io
    }

    /// What went wrong.
    public let reason: Reason
    /// The file or directory concerned.
    public let path: String
    /// The underlying message (SQLite's or the system's).
    public let detail: String

    /// Creates an error.
    public init(_ reason: Reason, path: String, detail: String) {
        self.reason = reason; self.path = path; self.detail = detail
    }

    /// One line: what, where, why, and what to do.
    public var description: String {
        switch reason {
        case .cannotCreateDirectory:
            return "cannot create the store directory \(path): \(detail). Create it, or point --data at a writable directory."
        case .notADirectory:
            return "the store directory \(path) exists but is not a directory. Remove or rename it, or choose another --data."
        case .cannotOpen:
            return "cannot open the store \(path): \(detail). Check that the file and its directory are readable and writable by this user."
        case .readOnly:
            return "the store \(path) is read-only: \(detail). Make the file and its directory writable by this user."
        case .notADatabase:
            return "the store \(path) is not a SQLite database (\(detail)). Restore it from a backup or move it aside; opqd will not start empty over it."
        case .corrupt:
            return
                "the store \(path) is damaged: \(detail). Restore it from a backup (or try `sqlite3 \(path) .recover`); opqd will not start over damaged data."
        case let .newerSchema(found, supported):
            return
                "the store \(path) has schema version \(found), but this opqd understands up to \(supported). Run a newer opqd, or restore a backup made by this version."
        case .foreignDatabase:
            return "the store \(path) is a SQLite database of another program (\(detail)). Point --data at an empty or opqd directory."
        case .inUse:
            return "the store \(path) is in use by another opqd process (\(detail)). Stop it first, or choose another --data."
        case .io:
            return "the store \(path) could not be read or written: \(detail). Check free disk space and the disk's health."
        }
    }
}
