import QueueEngine
import StoreKit
import Testing

/// Flow control (API.md "Flow control") is durable like queue settings: a queue's rate and
/// fairness weights, an operation's limits and fairness key, and the limiters themselves.
extension StoreConformanceTests {
    /// A limiter as the engine hands it to the store.
    static func limiter(_ name: String, _ settings: LimiterSettings, revision: UInt64 = 1) -> LimiterSnapshot {
        LimiterSnapshot(name: name, settings: settings, createdAt: t0.adding(seconds: Double(name.utf8.count)), revision: revision)
    }

    @Test(arguments: StoreKind.durable)
    func flowControlSurvivesCloseAndReopen(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            var rated = queueSnapshot("rated", max: 3, effective: 3, revision: 4)
            rated.rateLimit = RateLimit(perSecond: 2.5, burst: 5)
            // Keys that JSON must escape, and one PostgreSQL's text could not hold unescaped.
            rated.fairnessWeights = ["tenant-a": 3, "b \"quoted\" \\ 🚀": 1000, "nul\u{0}": 1, "": 2]
            var slow = queueSnapshot("slow")
            slow.rateLimit = RateLimit(perSecond: 0.001, burst: 1)
            let plain = queueSnapshot("plain")

            var limited = operationSnapshot(1, queue: "rated")
            limited.options = OperationOptions(
                timeout: 5, limits: [LimitRef(limiter: "stripe", key: "acct-42"), LimitRef(limiter: "mail"), LimitRef(limiter: "api", key: "k \"q\" \u{0}")],
                fairnessKey: "tenant-a")
            var fairOnly = operationSnapshot(2, queue: "rated")
            fairOnly.options.fairnessKey = "nul\u{0}inside \"quotes\" {braces} \\ NULL"
            var emptyKey = operationSnapshot(3, queue: "plain", state: .executing)
            emptyKey.options = OperationOptions(limits: [LimitRef(limiter: "stripe")], fairnessKey: "")
            let none = operationSnapshot(4, queue: "plain")
            let ops = [limited, fairOnly, emptyKey, none]

            let stripe = Self.limiter(
                "stripe",
                LimiterSettings(
                    concurrency: 2, rate: RateLimit(perSecond: 0.001, burst: 1),
                    overrides: [
                        "vip": LimiterBudget(concurrency: 5), "slow \"one\"": LimiterBudget(rate: RateLimit(perSecond: 0.5, burst: 1)),
                        "both": LimiterBudget(concurrency: 1_000_000_000, rate: RateLimit(perSecond: 100_000, burst: 1_000_000_000)),
                    ]))
            let mail = Self.limiter("mail", LimiterSettings(concurrency: 1))
            let api = Self.limiter("api", LimiterSettings(rate: RateLimit(perSecond: 1.25, burst: 3)))
            let store = try place.openDurable()
            store.append(
                [
                    .queue(rated), .queue(slow), .queue(plain), .limiter(stripe), .limiter(mail), .limiter(api),
                    .limiter(Self.limiter("gone", LimiterSettings(concurrency: 1))),
                ]
                    + ops.map { .operation($0) }, upTo: 1)
            #expect(waitDurable(store, 1))

            // An update and a delete in a later commit; and within one commit, the last record
            // of a limiter decides its row: an update after an update, a delete after an upsert,
            // an upsert after a delete.
            var mail2 = mail
            mail2.settings = LimiterSettings(concurrency: 4, rate: RateLimit(perSecond: 10, burst: 20), overrides: ["x": LimiterBudget(concurrency: 1)])
            mail2.revision = 2
            var mail3 = mail2
            mail3.settings.concurrency = 3
            mail3.revision = 3
            let flash = Self.limiter("flash", LimiterSettings(concurrency: 9))
            let back = Self.limiter("back", LimiterSettings(concurrency: 7), revision: 5)
            store.append(
                [
                    .limiter(mail2), .limiterDeleted("gone"), .limiter(flash), .limiter(Self.limiter("back", LimiterSettings(concurrency: 1))),
                    .limiter(mail3), .limiterDeleted("flash"), .limiterDeleted("back"), .limiter(back),
                ], upTo: 2)
            #expect(waitDurable(store, 2))
            store.close()

            let reopened = try place.openDurable()
            let state = try reopened.load()
            #expect(state.limiters == [api, back, mail3, stripe], "by name; running, waiting and keys are the engine's to count")
            #expect(state.operations == ops)
            let queues = Dictionary(uniqueKeysWithValues: state.queues.map { ($0.name, $0) })
            #expect(queues["rated"]?.rateLimit == rated.rateLimit)
            #expect(queues["rated"]?.fairnessWeights == rated.fairnessWeights)
            #expect(queues["slow"]?.rateLimit == slow.rateLimit)
            #expect(queues["slow"]?.fairnessWeights == [:])
            #expect(queues["plain"]?.rateLimit == nil)
            #expect(queues["plain"]?.fairnessWeights == [:])

            // A queue's rate and weights taken away again are gone after a reopen too.
            var unrated = rated
            unrated.rateLimit = nil
            unrated.fairnessWeights = [:]
            unrated.revision = 5
            reopened.append([.queue(unrated)], upTo: 3)
            #expect(waitDurable(reopened, 3))
            reopened.close()
            let again = try place.openDurable().load()
            let q = try #require(again.queues.first { $0.name == "rated" })
            #expect(q.rateLimit == nil && q.fairnessWeights == [:] && q.revision == 5)
        }
    }

    /// The engine on the store: limiters come back before the operations that name them, and
    /// each key's running and waiting operations are counted again.
    @Test(arguments: StoreKind.durable)
    func anEngineRestoresItsLimitersAndCountsTheirOperationsAgain(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let kind1 = ResumingKind()
            let store = try place.openDurable()
            let engine = QueueEngine(kinds: ["manual": kind1], store: store)
            try engine.createQueue(name: "work", maxConcurrentOperationCount: 10, rateLimit: RateLimit(perSecond: 50, burst: 100), fairnessWeights: ["big": 2])
            try engine.createLimiter(name: "stripe", settings: LimiterSettings(concurrency: 2, overrides: ["vip": LimiterBudget(concurrency: 1)]))
            try engine.createLimiter(name: "tmp", settings: LimiterSettings(rate: RateLimit(perSecond: 1, burst: 1)))
            try engine.updateLimiter("stripe", rate: .some(RateLimit(perSecond: 1000, burst: 1000)))
            try engine.deleteLimiter("tmp")
            let acct = LimitRef(limiter: "stripe", key: "acct-1")
            var ids: [OperationID] = []
            for i in 0..<5 {
                ids.append(
                    try engine.addOperationID(
                        to: "work", OperationRequest(kind: "manual", options: OperationOptions(limits: [acct], fairnessKey: i % 2 == 0 ? "big" : nil))))
            }
            let vip = try engine.addOperationID(
                to: "work", OperationRequest(kind: "manual", options: OperationOptions(limits: [LimitRef(limiter: "stripe", key: "vip")])))
            let free = try engine.addOperationID(to: "work", OperationRequest(kind: "manual"))
            let before = try engine.limiter(named: "stripe")
            #expect(before.running == 3 && before.waiting == 3 && before.keys == 2)
            #expect(waitDurable(engine))
            store.close()

            let store2 = try place.openDurable()
            let recovered = try store2.load()
            #expect(recovered.limiters.map(\.name) == ["stripe"])
            let engine2 = QueueEngine(kinds: ["manual": ResumingKind()], store: store2)
            engine2.restore(recovered)
            let after = try engine2.limiter(named: "stripe")
            #expect(after.settings == before.settings)
            #expect(after.createdAt == before.createdAt)
            #expect(after.revision > before.revision)
            // Executing ones resume (their kind says so) and hold their keys' slots again.
            #expect(after.running == 3 && after.waiting == 3 && after.keys == 2)
            #expect(throws: EngineError.self) { try engine2.limiter(named: "tmp") }
            let q = try engine2.queue(named: "work")
            #expect(q.rateLimit == RateLimit(perSecond: 50, burst: 100) && q.fairnessWeights == ["big": 2])
            #expect(try engine2.operation(ids[0]).options.limits == [acct])
            #expect(try engine2.operation(ids[0]).options.fairnessKey == "big")
            #expect(try engine2.operation(vip).state == .executing)
            #expect(try engine2.operation(free).options == OperationOptions())
            let keys = try engine2.limiterKeys("stripe").keys
            #expect(keys.map(\.key) == ["acct-1", "vip"])
            #expect(keys.map(\.running) == [2, 1] && keys.map(\.waiting) == [3, 0])
            // A limiter named by unfinished operations is still refused deletion after a restart.
            #expect(throws: EngineError.self) { try engine2.deleteLimiter("stripe") }
            #expect(waitDurable(engine2))
        }
    }
}
