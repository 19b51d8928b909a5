import Spindle
import Testing

/// `makeImmortal` (Support/Immortal.swift): immortal where the runtime's
/// private entry point is bound, a plain pass-through in the fallback; in
/// both, the global queues it is used for work.
@Suite("Immortal objects")
struct ImmortalTests {
    final class Tracked {
        let freed: LockedValue<Bool>
        init(_ freed: LockedValue<Bool>) { self.freed = freed }
        deinit { freed.withLock { $0 = true } }
    }

    @Test func immortalObjectOutlivesItsLastReferenceOnlyWhereSupported() {
        let freed = LockedValue(false)
        do {
            let object = Tracked(freed)
            #expect(makeImmortal(object) === object, "returns the same object")
        }
        if immortalObjectsAreSupported {
            #expect(!freed.withLock { $0 }, "an immortal object is never freed")
        } else {
            #expect(freed.withLock { $0 }, "the fallback leaves the object counted: freed with its last reference")
        }
    }

    @Test func globalQueuesWorkEitherWay() {
        let group = WorkGroup()
        for priority in WorkQueue.Priority.allCases {
            WorkQueue.global(priority).async(group: group) {}
        }
        WorkQueue.global().async(group: group) {}
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        #expect(WorkQueue.global() === WorkQueue.global())
    }
}
