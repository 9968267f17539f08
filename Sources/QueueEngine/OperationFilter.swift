/// Which operations of a queue a listing or a bulk cancel means: every condition given must
/// hold (none given matches every operation).
public struct OperationFilter: Sendable, Equatable {
    public var state: OperationState?
    /// The kind's name (`delay`, `http`, ..., `barrier`).
    public var kind: String?
    /// A prefix of the operation's `name`, compared byte for byte (UTF-8). An operation
    /// without a name never matches a prefix.
    public var namePrefix: String?

    public init(state: OperationState? = nil, kind: String? = nil, namePrefix: String? = nil) {
        self.state = state; self.kind = kind; self.namePrefix = namePrefix
    }

    /// True when no condition is set.
    public var isEmpty: Bool { state == nil && kind == nil && namePrefix == nil }

    func matches(_ op: OpRecord) -> Bool {
        if let state, op.state != state { return false }
        if let kind, op.kindName != kind { return false }
        if let namePrefix {
            guard let name = op.name, name.utf8.starts(with: namePrefix.utf8) else { return false }
        }
        return true
    }
}
