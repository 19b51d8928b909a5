import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

@Suite("ThreadLocal")
struct ThreadLocalTests {
    @Test func eachThreadHasItsOwnValue() throws {
        let local = ThreadLocal<Int>()
        #expect(local.value == nil)
        let threads = try (0..<4).map { index in
            try NativeThread.start { () -> (Int?, Int?) in
                let before = local.value
                local.value = index
                NativeThread.yield()
                return (before, local.value)
            }
        }
        for (index, thread) in threads.enumerated() {
            let (before, after) = try thread.join()
            #expect(before == nil)
            #expect(after == index)
        }
        #expect(local.value == nil, "the test's thread never stored one")
    }

    @Test func destructorRunsOncePerThreadBeforeJoinReturns() throws {
        let destroyed = LockedValue(0)
        let sum = LockedValue(0)
        let local = ThreadLocal<Int>(onThreadExit: { value in
            destroyed.withLock { $0 += 1 }
            sum.withLock { $0 += value }
        })
        let threads = try (1...8).map { index in
            try NativeThread.start { local.value = index }
        }
        for thread in threads { try thread.join() }
        #expect(destroyed.withLock { $0 } == 8)
        #expect(sum.withLock { $0 } == 36)
    }

    @Test func destructorRunsOnThreadsSpindleDidNotCreate() {
        let destroyed = LockedValue(0)
        let local = ThreadLocal<String>(onThreadExit: { _ in destroyed.withLock { $0 += 1 } })
        runThreads(3) { index in local.value = "thread \(index)" }
        #expect(destroyed.withLock { $0 } == 3)
    }

    @Test func replacingOrRemovingDoesNotCallTheDestructor() throws {
        let destroyed = LockedValue(0)
        let local = ThreadLocal<Int>(onThreadExit: { _ in destroyed.withLock { $0 += 1 } })
        let thread = try NativeThread.start { () -> Int? in
            local.value = 1
            local.value = 2
            let removed = local.removeValue()
            local.value = nil
            return removed
        }
        #expect(try thread.join() == 2)
        #expect(destroyed.withLock { $0 } == 0)
    }

    @Test func valueOrInsertMakesTheValueOnce() throws {
        let made = LockedValue(0)
        let local = ThreadLocal<[Int]>()
        let thread = try NativeThread.start { () -> [Int] in
            for _ in 0..<3 {
                _ = local.value(orInsert: {
                    made.withLock { $0 += 1 }
                    return [1]
                })
            }
            local.withValue { $0?.append(2) }
            local.withValue { $0!.append(3) }
            return local.value ?? []
        }
        #expect(try thread.join() == [1, 2, 3])
        #expect(made.withLock { $0 } == 1)
    }

    @Test func destructorsMayStoreValuesWhichAreDestroyedToo() throws {
        let order = LockedValue<[String]>([])
        let second = ThreadLocal<String>(onThreadExit: { value in order.withLock { $0.append(value) } })
        let first = ThreadLocal<String>(onThreadExit: { value in
            order.withLock { $0.append(value) }
            second.value = "stored by a destructor"
        })
        let later = ThreadLocal<String>(onThreadExit: { value in order.withLock { $0.append(value) } })
        let thread = try NativeThread.start {
            first.value = "first"
            later.value = "later"
        }
        try thread.join()
        // Reverse order of creation, then a second round for the new value.
        #expect(order.withLock { $0 } == ["later", "first", "stored by a destructor"])
    }

    @Test func destructorSeesTheExitingThreadAsCurrent() throws {
        let seen = LockedValue<Int32>(0)
        let local = ThreadLocal<Int>(onThreadExit: { _ in seen.withLock { $0 = NativeThread.current.id } })
        let thread = try NativeThread.start { local.value = 1 }
        try thread.join()
        #expect(seen.withLock { $0 } == thread.id)
    }
}
