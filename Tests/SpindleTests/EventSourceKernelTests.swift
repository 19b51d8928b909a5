// Event sources per kind, against the kernel: signal counts and the
// program's disposition (in exit tests: signals are process-wide), process
// exits (in exit tests: they fork), file-system events (and unmounting a
// watched file system, in a mount namespace of a child's own), descriptors
// that are not open, the data kinds' merge rules, and misuse.
#if canImport(Glibc)
import Glibc
#endif
import CShims
import Spindle
import Testing
import TestSupport

/// The first real-time signal number of the C library (glibc reserves 32
/// and 33 for itself, so it is 34 on Linux); `SIGRTMIN` is a function-like
/// macro that Swift does not import.
let realTimeSignalMin: Int32 = __libc_current_sigrtmin()

/// Counts calls of `ownSignalHandler`, a program's own handler that a
/// signal source must keep running. Allocated before the handler is
/// installed; touched in the handler only atomically.
nonisolated(unsafe) let ownHandlerCalls: UnsafeMutablePointer<Int> = {
    let p = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    p.initialize(to: 0)
    return p
}()

private let ownSignalHandler: @convention(c) (Int32) -> Void = { _ in
    AtomicMemory.add(1, to: ownHandlerCalls, ordering: .sequentiallyConsistent)
}

/// The current disposition of `signal`: (handler address, SA_SIGINFO set).
func disposition(_ signal: Int32) -> (handler: Int, siginfo: Bool) {
    var now = sigaction()
    sigaction(signal, nil, &now)
    return (unsafeBitCast(now.__sigaction_handler.sa_handler, to: Int.self), now.sa_flags & SA_SIGINFO != 0)
}

/// A signal source on a serial queue that sums its data and counts calls.
final class SignalTally: Sendable {
    let source: EventSource
    private let state: LockedValue<(calls: Int, sum: UInt64)>
    let cancelled: Spindle.Semaphore

    init(_ signal: Int32, label: String) throws {
        let state = LockedValue((calls: 0, sum: UInt64(0)))
        let cancelled = Semaphore(value: 0)
        source = try EventSource.signal(signal, on: .queue(WorkQueue(label: label)))
        source.setEventHandler { s in state.withLock { $0.calls += 1; $0.sum += s.data } }
        source.setCancelHandler { _ in cancelled.signal() }
        self.state = state
        self.cancelled = cancelled
    }

    var calls: Int { state.withLock { $0.calls } }
    var sum: UInt64 { state.withLock { $0.sum } }

    /// Cancels and waits for the cancel handler.
    func cancel() -> Bool {
        source.cancel()
        return cancelled.wait(timeout: .seconds(10)) == .completed
    }
}

@Suite("EventSource: kernel mechanisms")
struct EventSourceKernelTests {
    // MARK: Signals

    /// Deliveries are counted (SG5, where Dispatch on Linux reports 1):
    /// five SIGUSR1 raised while the source is suspended arrive as one call
    /// with data 5; 100 raised from another thread sum to 100; 1,000 of a
    /// real-time signal sent to the process from another thread (they queue
    /// in the kernel) sum to exactly 1,000.
    @Test func signalDeliveriesAreCountedExactly() async {
        await #expect(processExitsWith: .success) {
            unblockAllSignals()
            exit(countSignals())
        }
    }

    /// A signal left at its default action that terminates (SIGHUP) still
    /// terminates the process while a source observes it (SG1; Dispatch on
    /// Linux keeps the process alive).
    @Test func defaultActionStillTerminatesWhileObserved() async {
        await #expect(processExitsWith: .signal(SIGHUP)) {
            unblockAllSignals()
            armHangAlarm(seconds: 60)
            signal(SIGHUP, SIG_DFL)
            guard let tally = try? SignalTally(SIGHUP, label: "kernel.dfl") else { exit(2) }
            tally.source.activate()
            raise(SIGHUP)
            usleep(100_000)
            exit(3)  // survived: the default action was lost
        }
    }

    /// SIGTSTP left at its default while a source observes it: in an
    /// orphaned process group (a new session's) the kernel discards it, and
    /// so does the observer, which lets the kernel apply the default: the
    /// process is counted and never stops. In a group that is not orphaned
    /// it still stops the process, which counts the delivery once continued.
    /// Each case runs in a grandchild that the exit test's process watches
    /// with `waitpid(WUNTRACED)`, so that a stop never hangs the test.
    @Test func stopSignalsFollowTheKernelsRuleForOrphanedGroups() async {
        await #expect(processExitsWith: .success) {
            unblockAllSignals()
            armHangAlarm(seconds: 60)
            exit(stopSignalInGroups())
        }
    }

    /// With two sources on SIGHUP at its default, cancelling one leaves the
    /// observer in place; cancelling the last restores SIG_DFL, which then
    /// terminates the process.
    @Test func defaultDispositionIsRestoredAfterTheLastCancel() async {
        await #expect(processExitsWith: .signal(SIGHUP)) {
            unblockAllSignals()
            armHangAlarm(seconds: 60)
            signal(SIGHUP, SIG_DFL)
            guard let first = try? SignalTally(SIGHUP, label: "kernel.dfl-1"),
                let second = try? SignalTally(SIGHUP, label: "kernel.dfl-2")
            else { exit(2) }
            first.source.activate()
            second.source.activate()
            guard disposition(SIGHUP).siginfo else { exit(3) }
            guard first.cancel() else { exit(4) }
            guard disposition(SIGHUP).siginfo else { exit(5) }  // the second still observes
            guard second.cancel() else { exit(6) }
            let now = disposition(SIGHUP)
            guard !now.siginfo, now.handler == 0 else { exit(7) }  // SIG_DFL is 0
            raise(SIGHUP)
            usleep(100_000)
            exit(8)
        }
    }

    /// SIG_IGN stays ignoring (the process survives three SIGTERMs, each
    /// counted), and a signal whose default is to be ignored (SIGWINCH)
    /// stays harmless while observed.
    @Test func ignoredSignalsStayIgnoredWhileObserved() async {
        await #expect(processExitsWith: .success) {
            unblockAllSignals()
            armHangAlarm(seconds: 60)
            signal(SIGTERM, SIG_IGN)
            signal(SIGWINCH, SIG_DFL)
            guard let term = try? SignalTally(SIGTERM, label: "kernel.ign"),
                let winch = try? SignalTally(SIGWINCH, label: "kernel.winch")
            else { exit(2) }
            term.source.activate()
            winch.source.activate()
            for _ in 0..<3 {
                raise(SIGTERM)
                raise(SIGWINCH)
            }
            guard eventually({ term.sum == 3 && winch.sum == 3 }) else { exit(3) }
            guard term.cancel(), winch.cancel() else { exit(4) }
            guard disposition(SIGTERM).handler == unsafeBitCast(SIG_IGN, to: Int.self),
                disposition(SIGWINCH).handler == 0
            else { exit(5) }
            exit(0)
        }
    }

    /// A program's own handler keeps running (chained, SG4) while a source
    /// observes its signal, and is the disposition again after the cancel:
    /// its count follows every delivery, before and after, while the
    /// source's sum stops at the cancel.
    @Test func programsOwnHandlerIsChainedAndRestored() async {
        await #expect(processExitsWith: .success) {
            unblockAllSignals()
            armHangAlarm(seconds: 60)
            AtomicMemory.store(0, to: ownHandlerCalls, ordering: .sequentiallyConsistent)
            signal(SIGUSR2, ownSignalHandler)
            let own = disposition(SIGUSR2)
            guard let tally = try? SignalTally(SIGUSR2, label: "kernel.chain") else { exit(2) }
            tally.source.activate()
            guard disposition(SIGUSR2).siginfo else { exit(3) }
            for _ in 0..<4 { raise(SIGUSR2) }
            guard AtomicMemory.load(from: ownHandlerCalls, ordering: .sequentiallyConsistent) == 4 else { exit(4) }
            guard eventually({ tally.sum == 4 }) else { exit(5) }
            guard tally.cancel() else { exit(6) }
            let after = disposition(SIGUSR2)
            guard after.handler == own.handler, !after.siginfo else { exit(7) }
            raise(SIGUSR2)
            guard AtomicMemory.load(from: ownHandlerCalls, ordering: .sequentiallyConsistent) == 5 else { exit(8) }
            usleep(10_000)
            guard tally.sum == 4 else { exit(9) }
            exit(0)
        }
    }

    /// Signals that cannot be observed are refused at creation with
    /// `signalNotObservable` (SG2): SIGKILL and SIGSTOP (uncatchable),
    /// SIGSEGV, SIGILL, SIGBUS, SIGFPE (faults), 32 and 33 (the C
    /// library's), 0 and 65 (not signals). Nothing is installed.
    @Test func unobservableSignalsAreRefused() throws {
        let queue = WorkQueue(label: "kernel.refused")
        for signal in [SIGKILL, SIGSTOP, SIGSEGV, SIGILL, SIGBUS, SIGFPE, 32, 33, 0, 65, -1] {
            let error = #expect(throws: EventSourceError.self) { try EventSource.signal(signal, on: .queue(queue)) }
            guard case .signalNotObservable(let refused, let reason)? = error else {
                Issue.record("signal \(signal): \(String(describing: error))")
                continue
            }
            #expect(refused == signal)
            #expect(!reason.isEmpty)
        }
    }

    // MARK: Processes

    /// A child's exit is reported once with its status, on both kinds of
    /// target: `.exited(n)` for `_exit(n)`, `.signaled(SIGTERM)` for a
    /// child killed by SIGTERM; `data` is `.exit`, `handle` the pid; the
    /// child is not reaped (`waitpid` still returns its status).
    @Test func childExitIsReportedWithItsStatusAndLeftToReap() async {
        await #expect(processExitsWith: .success) {
            unblockAllSignals()
            armHangAlarm(seconds: 60)
            exit(watchChildren())
        }
    }

    /// Process sources cancelled just as their child exits: the cancel call
    /// (on a queue's worker) closes a source's pidfd while the reactor may
    /// be reading the exit status from it. 300 children, 16 sources on
    /// each, cancelled at staggered moments after the child is let exit:
    /// the process survives (the pidfd closes only after its
    /// last user), every cancel handler runs once, and every child is left
    /// to `waitpid`.
    @Test func processSourcesCancelledAsTheirChildExitsEndCleanly() async {
        await #expect(processExitsWith: .success) {
            unblockAllSignals()
            armHangAlarm(seconds: 120)
            exit(cancelAsChildrenExit(rounds: 300, sourcesPerChild: 16))
        }
    }

    /// The events Linux cannot observe without privileges are refused at
    /// creation (`processEventsNotObservable`, naming them); a process that
    /// does not exist gives `noSuchProcess` (a reaped child's pid, 0, -5).
    @Test func unobservableProcessEventsAndMissingProcessesAreRefused() async throws {
        let queue = WorkQueue(label: "kernel.process-refused")
        for events: EventSource.ProcessEvents in [.fork, .exec, .signal, [.exit, .fork], [.exit, .exec, .signal]] {
            #expect(throws: EventSourceError.processEventsNotObservable(events.subtracting(.exit))) {
                try EventSource.process(getpid(), events: events, on: .queue(queue))
            }
        }
        for pid: Int32 in [0, -5] {
            #expect(throws: EventSourceError.noSuchProcess(pid)) { try EventSource.process(pid, on: .queue(queue)) }
        }
        await #expect(processExitsWith: .success) {
            let child = fork()
            if child == 0 { _exit(0) }
            var status: Int32 = 0
            guard child > 0, waitpid(child, &status, 0) == child else { exit(2) }
            do {
                _ = try EventSource.process(child, on: .queue(WorkQueue(label: "kernel.gone")))
                exit(3)
            } catch let error as EventSourceError {
                exit(error == .noSuchProcess(child) ? 0 : 4)
            } catch {
                exit(5)
            }
        }
    }

    // MARK: File-system objects

    /// Each change to a file, with the source's descriptor open, is told
    /// apart as `FileEvents` maps inotify: an overwrite is `write` only; an
    /// append is `write` and `extend`; a truncation is `write` without
    /// `extend`; chmod is `attributes`; a second name (link) and its removal
    /// are `attributes` and `link`; a rename is `rename`; the removal of the
    /// last name is `delete` (link count 0). The cancel handler closes.
    @Test(arguments: HandlerPlaceKind.allCases)
    func fileChangesAreToldApart(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "kernel.vnode")
        defer { place.close() }
        let path = scratchPath("vnode-kinds-\(kind)")
        let other = scratchPath("vnode-kinds-\(kind)-link")
        let moved = scratchPath("vnode-kinds-\(kind)-moved")
        #expect(writeFile(path, pattern(100)))
        defer { for name in [path, other, moved] { unlink(name) } }
        let fd = open(path, O_RDWR)
        try #require(fd >= 0)
        let seen = LockedValue<[EventSource.FileEvents]>([])
        let called = Semaphore(value: 0)
        let finished = Semaphore(value: 0)
        let source = try EventSource.fileSystemObject(descriptor: fd, events: .all, on: place.target)
        source.setEventHandler { s in seen.withLock { $0.append(s.fileEvents) }; called.signal() }
        source.setCancelHandler { s in close(s.handle); finished.signal() }
        source.activate()

        /// The next call, in order (one per `called` signal), is `expected`.
        var taken = 0
        func expectNext(_ expected: EventSource.FileEvents, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
            guard called.wait(timeout: .seconds(10)) == .completed else {
                Issue.record("no event for \(what)", sourceLocation: sourceLocation)
                return
            }
            let call = seen.withLock { $0[taken] }
            taken += 1
            #expect(call == expected, "\(what): \(call.rawValue), expected \(expected.rawValue)", sourceLocation: sourceLocation)
        }
        #expect(pwrite(fd, [9, 9, 9], 3, 10) == 3)
        expectNext(.write, "overwrite")
        #expect(pwrite(fd, [8, 8, 8], 3, 100) == 3)
        expectNext([.write, .extend], "append")
        #expect(ftruncate(fd, 50) == 0)
        expectNext(.write, "truncation")
        #expect(fchmod(fd, 0o640) == 0)
        expectNext(.attributes, "chmod")
        #expect(link(path, other) == 0)
        expectNext([.attributes, .link], "link")
        #expect(unlink(other) == 0)
        expectNext([.attributes, .link], "unlink of the other name")
        #expect(rename(path, moved) == 0)
        expectNext(.rename, "rename")
        #expect(unlink(moved) == 0)
        expectNext([.delete, .attributes, .link], "deletion of the last name")
        source.cancel()
        #expect(finished.wait(timeout: .seconds(10)) == .completed)
        #expect(seen.withLock { $0.count } == 8)
    }

    /// A source on a directory reports changes of its entries, as a kqueue
    /// vnode source on a directory does: creating, renaming (one call or
    /// two) and removing a file in it is `write`; making or removing a subdirectory is `write`
    /// and `link` (the directory's link count changes). A directory's size
    /// is not reported as `extend`, nor a write or chmod of a file in it
    /// (inotify reports those to a directory watch too, named).
    @Test(arguments: HandlerPlaceKind.allCases)
    func directoryReportsEntriesCreatedRemovedAndRenamed(_ kind: HandlerPlaceKind) throws {
        let place = try HandlerPlace(kind, label: "kernel.vnode-directory")
        defer { place.close() }
        let directory = scratchPath("vnode-directory-\(kind)")
        try #require(mkdir(directory, 0o700) == 0)
        let file = directory + "/entry", renamed = directory + "/renamed", sub = directory + "/sub"
        defer { for name in [file, renamed] { unlink(name) }; rmdir(sub); rmdir(directory) }
        let fd = open(directory, O_RDONLY | O_DIRECTORY)
        try #require(fd >= 0)
        let seen = LockedValue<[EventSource.FileEvents]>([])
        let called = Semaphore(value: 0)
        let finished = Semaphore(value: 0)
        let source = try EventSource.fileSystemObject(descriptor: fd, events: .all, on: place.target)
        source.setEventHandler { s in seen.withLock { $0.append(s.fileEvents) }; called.signal() }
        source.setCancelHandler { s in close(s.handle); finished.signal() }
        source.activate()

        /// The next call's events are `expected`; or, with `orFirst`, a
        /// call of `orFirst` (left from the step before) then `expected`.
        /// Calls are taken in order, one per `called` signal: the next call
        /// may already have run by the time this one is looked at, so the
        /// latest call is not necessarily this one (in a TSan pass, the
        /// rename's second call and the mkdir's had both run when the mkdir
        /// step looked; reading the latest, every later step read the call
        /// before its own).
        var taken = 0
        func expectNext(
            _ expected: EventSource.FileEvents, _ what: String, orFirst earlier: EventSource.FileEvents? = nil,
            sourceLocation: SourceLocation = #_sourceLocation
        ) {
            guard called.wait(timeout: .seconds(10)) == .completed else {
                Issue.record("no event for \(what)", sourceLocation: sourceLocation)
                return
            }
            let call = seen.withLock { $0[taken] }
            taken += 1
            if let earlier, call == earlier, call != expected {
                expectNext(expected, what, sourceLocation: sourceLocation)
                return
            }
            #expect(call == expected, "\(what): \(call), expected \(expected); calls so far: \(seen.withLock { $0 })", sourceLocation: sourceLocation)
        }
        #expect(writeFile(file, [1, 2, 3]))
        expectNext(.write, "a file created")
        // Inside an entry: the file's change, not the directory's (reported,
        // it would be a call of its own or join the rename's).
        #expect(chmod(file, 0o640) == 0)
        // A rename is two inotify events (IN_MOVED_FROM, IN_MOVED_TO), which
        // the reactor may read apart: one `write` call, or two, the second
        // perhaps joining the next step's (told apart by its `link`).
        #expect(rename(file, renamed) == 0)
        expectNext(.write, "a file renamed")
        #expect(mkdir(sub, 0o700) == 0)
        expectNext([.write, .link], "a subdirectory made", orFirst: .write)
        #expect(unlink(renamed) == 0)
        expectNext(.write, "a file removed")
        #expect(rmdir(sub) == 0)
        expectNext([.write, .link], "a subdirectory removed")
        source.cancel()
        #expect(finished.wait(timeout: .seconds(10)) == .completed)
        #expect((5...6).contains(seen.withLock { $0.count }), "\(seen.withLock { $0 })")
    }

    /// A source asks only for what it wants: a `.write` source does not
    /// fire for chmod or rename, and its data never holds other events.
    @Test func fileEventsOutsideTheMaskAreNotReported() throws {
        let queue = WorkQueue(label: "kernel.vnode-mask")
        let path = scratchPath("vnode-mask")
        let moved = scratchPath("vnode-mask-moved")
        #expect(writeFile(path, [1]))
        defer { unlink(path); unlink(moved) }
        let fd = open(path, O_RDWR)
        try #require(fd >= 0)
        let seen = LockedValue<[UInt64]>([])
        let called = Semaphore(value: 0)
        let source = try EventSource.fileSystemObject(descriptor: fd, events: .write, on: .queue(queue))
        source.setEventHandler { s in seen.withLock { $0.append(s.data) }; called.signal() }
        source.setCancelHandler { s in close(s.handle) }
        source.activate()
        #expect(fchmod(fd, 0o600) == 0)
        #expect(rename(path, moved) == 0)
        #expect(pwrite(fd, [2], 1, 0) == 1)
        #expect(called.wait(timeout: .seconds(10)) == .completed)
        sleepBriefly()
        #expect(seen.withLock { $0 } == [EventSource.FileEvents.write.rawValue])
        source.cancel()
    }

    /// A file system that holds a watched file cannot be unmounted, and
    /// that is reported at once, not hung on (as `FileEvents` documents):
    /// `umount` fails with `EBUSY` while the source's descriptor is open,
    /// and the source goes on reporting writes; its cancel handler runs
    /// once. A lazy unmount (`MNT_DETACH`) succeeds and reports nothing
    /// while the descriptor is open (a second source still sees writes,
    /// and no `revoke`); cancelling it and closing the descriptor ends
    /// cleanly, and a watch made afterwards works. In a forked child, on a
    /// tmpfs mounted in a private mount namespace; where that is refused
    /// (no CAP_SYS_ADMIN) the test is cancelled with the reason.
    @Test func busyFileSystemRefusesUnmountWhileWatched() async throws {
        let result = await #expect(processExitsWith: .success, observing: [\.standardOutputContent]) {
            runOnForkedMainThread(unmountWhileWatched)
        }
        let text = String(decoding: result?.standardOutputContent ?? [], as: UTF8.self)
        if let skip = text.split(separator: "\n").first(where: { $0.hasPrefix("SKIP: ") }) {
            try Test.cancel(Comment(rawValue: String(skip.dropFirst(6))))
        }
    }

    // MARK: Descriptors that are not open

    /// A read, write or file-system source on a descriptor that is not open
    /// is refused with `descriptorNotOpen` (951: a number this test alone
    /// uses, checked closed first).
    @Test func sourcesOnAClosedDescriptorAreRefused() throws {
        let fd: Int32 = 951
        try #require(fcntl(fd, F_GETFD) == -1 && errno == EBADF)
        let queue = WorkQueue(label: "kernel.closed")
        #expect(throws: EventSourceError.descriptorNotOpen(fd)) { try EventSource.read(descriptor: fd, on: .queue(queue)) }
        #expect(throws: EventSourceError.descriptorNotOpen(fd)) { try EventSource.write(descriptor: fd, on: .queue(queue)) }
        #expect(throws: EventSourceError.descriptorNotOpen(fd)) {
            try EventSource.fileSystemObject(descriptor: fd, events: .all, on: .queue(queue))
        }
    }

    // MARK: Data sources

    /// An `.or` source merges under its mask: bits outside it are dropped,
    /// and a merge with nothing inside it does not fire; `mask` is the mask.
    @Test func orSourceMergesUnderItsMask() {
        let queue = WorkQueue(label: "kernel.or")
        let source = EventSource.data(.or, mask: 0b0110, on: .queue(queue))
        #expect(source.mask == 0b0110)
        let seen = LockedValue<[UInt64]>([])
        source.setEventHandler { s in seen.withLock { $0.append(s.data) } }
        source.activate()
        source.suspend()
        source.merge(data: 0b1111)
        source.merge(data: 0b0010)
        source.resume()
        queue.sync {}
        source.merge(data: 0b1001)  // nothing inside the mask
        queue.sync {}
        source.merge(data: 0b0100)
        queue.sync {}
        #expect(seen.withLock { $0 } == [0b0110, 0b0100])
        source.cancel()
    }

    /// A `.replace` source delivers the latest value merged since its last
    /// call.
    @Test func replaceSourceKeepsTheLatestValue() {
        let queue = WorkQueue(label: "kernel.replace")
        let source = EventSource.data(.replace, on: .queue(queue))
        let seen = LockedValue<[UInt64]>([])
        source.setEventHandler { s in seen.withLock { $0.append(s.data) } }
        source.activate()
        source.suspend()
        for value: UInt64 in [5, 9, 3] { source.merge(data: value) }
        source.resume()
        queue.sync {}
        source.merge(data: 42)
        queue.sync {}
        #expect(seen.withLock { $0 } == [3, 42])
        source.cancel()
    }

    /// Merging 0 does nothing, in every merge kind (no call is submitted);
    /// merges after the cancel are ignored.
    @Test func zeroMergesAndMergesAfterCancelDoNothing() {
        let queue = WorkQueue(label: "kernel.zero")
        let calls = LockedValue(0)
        let finished = Semaphore(value: 0)
        var sources: [EventSource] = []
        for merge: EventSource.DataMerge in [.add, .or, .replace] {
            let source = EventSource.data(merge, on: .queue(queue))
            source.setEventHandler { _ in calls.withLock { $0 += 1 } }
            source.setCancelHandler { _ in finished.signal() }
            source.activate()
            source.merge(data: 0)
            sources.append(source)
        }
        queue.sync {}
        #expect(calls.withLock { $0 } == 0)
        for source in sources { source.cancel() }
        for _ in sources { #expect(finished.wait(timeout: .seconds(10)) == .completed) }
        for source in sources { source.merge(data: 7) }
        queue.sync {}
        sleepBriefly()
        #expect(calls.withLock { $0 } == 0)
    }

    // MARK: Misuse

    /// `merge(data:)` on a timer stops the process with a message.
    @Test func mergeIntoATimerIsAPreconditionFailure() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let timer = EventSource.timer(interval: .seconds(1), on: .queue(WorkQueue(label: "kernel.misuse")))
            timer.merge(data: 1)
        }
        let text = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(text.contains("is not a data source"), "\(text)")
    }

    /// Resuming an active source more often than it was suspended stops the
    /// process with a message.
    @Test func resumingMoreThanSuspendedIsAPreconditionFailure() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let source = EventSource.data(.add, on: .queue(WorkQueue(label: "kernel.misuse")))
            source.activate()
            source.suspend()
            source.resume()
            source.resume()
        }
        let text = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(text.contains("resumed more often than it was suspended"), "\(text)")
    }
}

/// `signalDeliveriesAreCountedExactly` in its own process: 0, or the
/// failed check.
private func countSignals() -> Int32 {
    armHangAlarm(seconds: 60)
    signal(SIGUSR1, SIG_IGN)
    signal(SIGUSR2, SIG_IGN)
    let realTime = realTimeSignalMin + 3
    signal(realTime, SIG_IGN)  // a real-time signal's default would terminate
    guard let usr1 = try? SignalTally(SIGUSR1, label: "kernel.usr1"),
        let marker = try? SignalTally(SIGUSR2, label: "kernel.marker"),
        let rt = try? SignalTally(realTime, label: "kernel.rt")
    else { return 2 }
    usr1.source.activate()
    marker.source.activate()
    rt.source.activate()

    // Five while suspended; the marker, raised after them, shows that the
    // reactor has counted them (it reads every signal's count each time).
    usr1.source.suspend()
    for _ in 0..<5 { raise(SIGUSR1) }  // delivered to this thread before raise returns
    raise(SIGUSR2)
    guard eventually({ marker.sum == 1 }) else { return 3 }
    usleep(10_000)
    guard usr1.calls == 0 else { return 4 }
    usr1.source.resume()
    guard eventually({ usr1.sum == 5 }) else { return 5 }
    usleep(10_000)
    guard usr1.calls == 1, usr1.sum == 5 else { return 6 }

    // 100 from another thread, each raised at that thread.
    let join = startThread { for _ in 0..<100 { raise(SIGUSR1) } }
    join()
    guard eventually({ usr1.sum == 105 }) else { return 7 }

    // A real-time burst to the process: the kernel queues each one.
    let sent = LockedValue(0)
    let burst = startThread {
        for _ in 0..<1000 where kill(getpid(), realTime) == 0 { sent.withLock { $0 += 1 } }
    }
    burst()
    guard sent.withLock({ $0 }) == 1000 else { return 8 }
    guard eventually({ rt.sum >= 1000 }) else { return 9 }
    usleep(10_000)
    guard rt.sum == 1000 else { return 10 }
    guard usr1.cancel(), marker.cancel(), rt.cancel() else { return 11 }
    return 0
}

/// `stopSignalsFollowTheKernelsRuleForOrphanedGroups` in its own process:
/// 0, or the failed check.
private func stopSignalInGroups() -> Int32 {
    for orphaned in [true, false] {
        let child = fork()
        if child == 0 {
            // A new session: its only group is orphaned (the parent is in
            // another session). A new group in this session: not orphaned
            // (the parent is in another group of the same session).
            if orphaned { guard setsid() > 0 else { _exit(20) } } else { guard setpgid(0, 0) == 0 else { _exit(21) } }
            signal(SIGTSTP, SIG_DFL)
            guard let tally = try? SignalTally(SIGTSTP, label: "kernel.tstp") else { _exit(22) }
            tally.source.activate()
            raise(SIGTSTP)  // stops here, unless orphaned
            guard eventually({ tally.sum == 1 }) else { _exit(23) }
            _exit(0)
        }
        guard child > 0 else { return 2 }
        var stopped = false
        var status: Int32 = 0
        while true {
            guard waitpid(child, &status, WUNTRACED) == child else { return 3 }
            if status & 0xff == 0x7f {  // stopped
                stopped = true
                kill(child, SIGCONT)
                continue
            }
            break
        }
        guard status & 0x7f == 0 else { return 4 }  // ended by a signal
        let code = (status >> 8) & 0xff
        guard code == 0 else { return 10 + code }
        guard stopped == !orphaned else { return orphaned ? 5 : 6 }
    }
    return 0
}

/// `processSourcesCancelledAsTheirChildExitsEndCleanly` in its own
/// process: 0, or the failed check.
private func cancelAsChildrenExit(rounds: Int, sourcesPerChild: Int) -> Int32 {
    let queue = WorkQueue(label: "kernel.exit-cancel", kind: .concurrent)
    for round in 0..<rounds {
        var gate: [Int32] = [0, 0]
        guard pipe(&gate) == 0 else { return 2 }
        let child = fork()
        if child == 0 {
            close(gate[1])
            var byte: UInt8 = 0
            _ = read(gate[0], &byte, 1)  // until the parent's sources are active
            _exit(0)
        }
        guard child > 0 else { return 3 }
        close(gate[0])
        let cancelled = LockedValue(0)
        let finished = Semaphore(value: 0)
        var sources: [EventSource] = []
        for _ in 0..<sourcesPerChild {
            guard let source = try? EventSource.process(child, on: .queue(queue)) else { return 4 }
            source.setEventHandler { _ in }
            source.setCancelHandler { _ in cancelled.withLock { $0 += 1 }; finished.signal() }
            source.activate()
            sources.append(source)
        }
        close(gate[1])  // the child exits: every pidfd becomes readable at once
        // The reactor reads the sources' exits one after another while the
        // queue's workers run their cancel calls: staggered over 0–300 µs,
        // the last-read first, so that the two sweeps cross.
        let spin = MonotonicClock.now.advanced(by: .microseconds(Int64(round * 37 % 301)))
        while MonotonicClock.now < spin {}
        for source in sources.reversed() { source.cancel() }
        for _ in 0..<sourcesPerChild {
            guard finished.wait(timeout: .seconds(10)) == .completed else { return 5 }
        }
        guard cancelled.withLock({ $0 }) == sourcesPerChild else { return 6 }
        var status: Int32 = 0
        guard waitpid(child, &status, 0) == child, status == 0 else { return 7 }
    }
    return 0
}

/// `childExitIsReportedWithItsStatusAndLeftToReap` in its own process: 0,
/// or the failed check.
private func watchChildren() -> Int32 {
    for (round, kind) in HandlerPlaceKind.allCases.enumerated() {
        guard let place = try? HandlerPlace(kind, label: "kernel.child") else { return 2 }
        defer { place.close() }
        for ending in 0..<2 {
            var gate: [Int32] = [0, 0]
            guard pipe(&gate) == 0 else { return 3 }
            let code = Int32(40 + round * 2 + ending)
            let child = fork()
            if child == 0 {
                close(gate[1])
                var byte: UInt8 = 0
                _ = read(gate[0], &byte, 1)  // until the parent's source is active
                if ending == 1 {
                    kill(getpid(), SIGTERM)
                    pause()
                }
                _exit(code)
            }
            guard child > 0 else { return 4 }
            close(gate[0])
            let seen = LockedValue<[(UInt64, EventSource.ExitStatus?, Int32, Bool)]>([])
            let called = Semaphore(value: 0)
            let finished = Semaphore(value: 0)
            guard let source = try? EventSource.process(child, on: place.target) else { return 5 }
            guard source.mask == EventSource.ProcessEvents.exit.rawValue, source.handle == child else { return 6 }
            source.setEventHandler { s in
                seen.withLock { $0.append((s.data, s.exitStatus, s.handle, place.isCurrent)) }
                called.signal()
            }
            source.setCancelHandler { _ in finished.signal() }
            source.activate()
            close(gate[1])  // the child may exit now
            guard called.wait(timeout: .seconds(10)) == .completed else { return 7 }
            usleep(20_000)
            let calls = seen.withLock { $0 }
            guard calls.count == 1 else { return 8 }
            let expected: EventSource.ExitStatus = ending == 0 ? .exited(code) : .signaled(SIGTERM, coreDumped: false)
            guard calls[0].0 == EventSource.ProcessEvents.exit.rawValue, calls[0].2 == child, calls[0].3 else { return 9 }
            guard calls[0].1 == expected, source.exitStatus == expected else { return 10 }
            var status: Int32 = 0
            guard waitpid(child, &status, WNOHANG) == child else { return 11 }  // not reaped by the source
            if ending == 0 {
                guard status & 0x7f == 0, (status >> 8) & 0xff == code else { return 12 }
            } else {
                guard status & 0x7f == SIGTERM else { return 13 }
            }
            source.cancel()
            guard finished.wait(timeout: .seconds(10)) == .completed else { return 14 }
        }
    }
    return 0
}

/// `busyFileSystemRefusesUnmountWhileWatched` in a forked child of its own
/// (so every thread Spindle starts is in the new mount namespace): 0, or
/// the failed check; 0 with a `SKIP:` line on standard output where mounting is
/// refused.
private func unmountWhileWatched() -> Int32 {
    func skip(_ what: String) -> Int32 {
        let code = errno
        print("SKIP: \(SystemCallError(call: what, code: code)); a private tmpfs mount needs CAP_SYS_ADMIN")
        return code == EPERM || code == EACCES ? 0 : 2
    }
    let rc = cshims_unshare_private_mounts()
    if rc < 0 {
        errno = -rc
        return skip("unshare(CLONE_NEWNS)")
    }
    var template = Array("/tmp/spindle-es-unmount-XXXXXX".utf8CString)
    guard let made = mkdtemp(&template) else { return 3 }
    let dir = String(cString: made)
    defer { rmdir(dir) }
    guard mount("spindle-es", dir, "tmpfs", 0, "size=1m") == 0 else { return skip("mount(tmpfs)") }
    let fd = open("\(dir)/watched", O_RDWR | O_CREAT, 0o600)
    guard fd >= 0 else { return 4 }

    let queue = WorkQueue(label: "kernel.unmount")
    let seen = LockedValue<[EventSource.FileEvents]>([])
    let called = Semaphore(value: 0)
    let cancels = LockedValue(0)
    let finished = Semaphore(value: 0)
    func watch() -> EventSource? {
        guard let source = try? EventSource.fileSystemObject(descriptor: fd, events: .all, on: .queue(queue)) else { return nil }
        source.setEventHandler { s in seen.withLock { $0.append(s.fileEvents) }; called.signal() }
        source.setCancelHandler { _ in cancels.withLock { $0 += 1 }; finished.signal() }
        source.activate()
        return source
    }

    // Busy: refused at once, and the source goes on.
    guard let first = watch() else { return 5 }
    guard umount(dir) == -1, errno == EBUSY else { return 6 }
    guard pwrite(fd, [1, 2, 3], 3, 0) == 3, called.wait(timeout: .seconds(10)) == .completed else { return 7 }
    guard seen.withLock({ $0.last })?.contains(.write) == true else { return 8 }
    first.cancel()
    guard finished.wait(timeout: .seconds(10)) == .completed else { return 9 }
    usleep(20_000)
    guard cancels.withLock({ $0 }) == 1 else { return 10 }

    // Lazy: detached at once; nothing is reported while the descriptor is open.
    guard let second = watch() else { return 11 }
    guard umount2(dir, Int32(MNT_DETACH)) == 0 else { return 12 }
    guard pwrite(fd, [4], 1, 3) == 1, called.wait(timeout: .seconds(10)) == .completed else { return 13 }
    usleep(20_000)
    guard !seen.withLock({ $0.contains { $0.contains(.revoke) } }) else { return 14 }
    second.cancel()
    guard finished.wait(timeout: .seconds(10)) == .completed else { return 15 }
    close(fd)  // the last reference: the detached tmpfs goes now

    // The reactor is not stuck: a new watch on another file still works.
    let path = scratchPath("after-unmount")
    guard writeFile(path, [1]) else { return 16 }
    defer { unlink(path) }
    let other = open(path, O_RDWR)
    guard other >= 0,
        let third = try? EventSource.fileSystemObject(descriptor: other, events: .write, on: .queue(queue))
    else { return 17 }
    third.setEventHandler { _ in called.signal() }
    third.setCancelHandler { _ in close(other); finished.signal() }
    third.activate()
    guard pwrite(other, [2], 1, 0) == 1, called.wait(timeout: .seconds(10)) == .completed else { return 18 }
    third.cancel()
    guard finished.wait(timeout: .seconds(10)) == .completed else { return 19 }
    let total = cancels.withLock { $0 }
    return total == 2 ? 0 : 20
}
