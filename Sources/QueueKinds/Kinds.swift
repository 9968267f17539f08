import QueueEngine

/// Kinds this build cannot run yet: refused at creation with a clear message.
public struct UnavailableKind: OperationKind {
    public let name: String
    public init(name: String) { self.name = name }
    public func validate(spec: JSONValue?) throws(EngineError) {
        throw .invalidArgument(field: "kind", detail: "kind \(name) is not available on this server yet; available kinds: delay, http, command")
    }
    public func start(_ context: ExecutionContext) { context.finish(.failed(type: "unavailable", detail: "kind \(name) is not available")) }
    public func cancel(_ context: ExecutionContext) {}
    public func pause(_ context: ExecutionContext) {}
}

/// The kinds a server offers, by name.
public func standardKinds(_ configuration: KindsConfiguration = KindsConfiguration()) -> [String: any OperationKind] {
    [
        "delay": DelayKind(),
        "http": HTTPKind(),
        "command": CommandKind(configuration),
        "external": UnavailableKind(name: "external"),
    ]
}

/// What the kinds may do on this server.
public struct KindsConfiguration: Sendable {
    /// Executables `command` operations may run (absolute paths). Empty: the kind is off.
    /// `argv[0]` must equal one of them exactly; symlinks are not resolved on either side, so
    /// allowing `/usr/bin/python3` does not allow `/usr/bin/python3.11` or the other way round.
    public var allowCommands: [String] = []
    /// `command` children running at once; more wait for a slot.
    public var maxCommands: Int = 16
    public init(allowCommands: [String] = [], maxCommands: Int = 16) {
        self.allowCommands = allowCommands
        self.maxCommands = maxCommands
    }
}
