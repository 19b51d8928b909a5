import CShims

#if canImport(Glibc)
import Glibc
#endif

/// The one place Spindle sleeps on descriptors and time: registrations of
/// descriptors over one `EventBackend`, the wake word, and the wait.
///
/// A **registration** is one interest (readable, writable or both) in one
/// descriptor, named by the token `register` returns. A descriptor may carry
/// several registrations (a socket's reader and writer), in one registry or
/// several. Each registration is one-shot: after it is reported it stays
/// quiet until `rearm`. The registry watches each descriptor once in the
/// kernel, for the union of its armed registrations' interests, and hands a
/// report to each armed registration it concerns (`.error` and `.hangup` to
/// all of them); the others stay armed and the descriptor is watched again
/// for them.
///
/// **Threads.** `register`, `deregister` and `rearm` work from any thread:
/// they change the record under the registry's lock, and the owner thread
/// (the one that calls `wait`) tells the kernel at its next `wait` or
/// `applyChanges`. A caller on another thread that wants the change to take
/// effect now calls `wake()`. `wait` and `applyChanges` are for the owner
/// thread only; `wake()` for any.
///
/// **Descriptors.** The registry never closes a descriptor. Closing one while
/// it is registered is allowed: the descriptor is reported failed (EBADF)
/// the next time it is watched, and its registrations are disarmed. Closing
/// after `deregister` and reusing the number at once is the ordinary case and
/// safe on both backends: every kernel watch carries a generation, and a
/// report from an older watch of the same number is dropped.
///
/// **Errors.** What the caller can check at once (`register`: a descriptor
/// that is not open, a regular file or directory, which are always ready and
/// cannot be waited on) throws. What the kernel says later (EBADF for a
/// descriptor closed while registered; ENOMEM, ENOSPC, EPERM when it refuses
/// a watch) is reported by `wait` as a `ReadyEvent` with `failure`; the
/// registration is disarmed. Nothing here stops the process for a condition
/// of the environment.
///
/// **Memory order.** What a thread wrote before `register`, `rearm` or
/// `wake()` is visible to the owner after the `wait` that sees it (the
/// registry's lock, the wake word's release/acquire pair).
package final class EventRegistry: @unchecked Sendable {
    // @unchecked: `registrations`, `descriptors`, `dirty`, `failures` and the
    // counters are guarded by `lock`; `completions` is the owner thread's;
    // `wakeState` is atomic words; `backend` is used as its protocol says.

    /// The kernel interface.
    package let backend: any EventBackend
    let wakeState = LoopWakeState()
    private let lock = GuardLock()

    private struct Registration {
        let fd: Int32
        let interest: Readiness
        var armed: Bool
        /// Whether the descriptor's current kernel watch was made with this
        /// registration in it. A report of a watch made before the
        /// registration joined concerns whatever file had the number then
        /// (closed and reused since, perhaps), so it never reaches it.
        var covered = false
    }

    private struct Descriptor {
        /// Its registrations, in registration order.
        var tokens: [UInt64] = []
        /// The kernel watch made for it and not removed.
        var watch: KernelWatch?
        /// The interest `watch` was made with.
        var watched: Readiness = []
        /// Whether it is in `dirty`.
        var queued = false
        /// Whether a registration joined since the watch was made: then the
        /// watch may be on another file that had this number (closed and
        /// the number reused meanwhile), so a new one is made.
        var joined = false
    }

    /// In the parent, before `fork()` (`PoolPoller.prepareForFork`): the
    /// generic types and conformances the registry's code and the epoll
    /// backend make on first use. A forked child's poller makes a registry
    /// of its own and waits in it from its first moment
    /// (`ForkHandlers.makeMetadata`; `scripts/check-fork-metadata`).
    static func prepareForFork() {
        ForkHandlers.makeMetadata(
            [Int32: Descriptor].self, [UInt64: Registration].self, (Int32, Descriptor).self,
            (UInt64, Registration).self, [ReadyEvent].self, [KernelCompletion].self, [Int32].self, [UInt32].self,
            [UInt64].self, (Bool, Bool, Bool).self, (Int, Int).self, IndexingIterator<[KernelCompletion]>.self,
            IndexingIterator<[Int32]>.self, IndexingIterator<[UInt64]>.self)
        ForkHandlers.makeConformance(equatable: KernelWatch.self)
        ForkHandlers.makeConformance(equatable: EventBackendKind.self)
        ForkHandlers.makeConformance(equatable: Readiness.self)
        ForkHandlers.makeConformance(setAlgebra: Readiness.self)
        ForkHandlers.makeConformance(optionSet: Readiness.self)
        ForkHandlers.makeConformance(error: DescriptorWatchError.self)
        ForkHandlers.makeConformance(error: SystemCallError.self)
        ForkHandlers.makeConformance(described: SystemCallError.self)
        ForkHandlers.makeConformance(hashable: LoopWakeState.Prelude.self)
        ForkHandlers.makeConformance(equatable: LoopWakeState.Prelude.self)
        ForkHandlers.makeConformance(fixedWidthInteger: UInt32.self)
        ForkHandlers.makeConformance(mutable: [ReadyEvent].self)
        ForkHandlers.makeConformance(collection: [ReadyEvent].self)
        ForkHandlers.makeConformance(rangeReplaceable: [ReadyEvent].self)
        ForkHandlers.makeConformance(collection: [KernelCompletion].self)
        ForkHandlers.makeConformance(collection: [Int32].self)
        ForkHandlers.makeConformance(sequence: [UInt64].self)
        ForkHandlers.makeConformance(collection: [UInt64].self)
        ForkHandlers.makeConformance(mutable: [UInt64].self)
        ForkHandlers.makeConformance(rangeReplaceable: [UInt64].self)
    }

    private var registrations: [UInt64: Registration] = [:]
    private var descriptors: [Int32: Descriptor] = [:]
    /// Descriptors whose kernel watch may not match their registrations.
    private var dirty: [Int32] = []
    /// Failures found while applying changes, reported by the next `wait`.
    private var failures: [ReadyEvent] = []
    private var nextToken: UInt64 = 1
    private var generation: UInt32 = 0
    /// Whether some descriptor has a watch that has not reported: then a
    /// wait must sleep in the kernel, not on the wake word.
    private var pendingWatches = 0
    /// Whether the owner's last wait found no watch in the kernel and so may
    /// be sleeping on the wake word, where a watch made by another thread
    /// (`rearmNow`) would not reach it. Set and read under `lock`; a stale
    /// true costs one wake.
    private var ownerMaySleepOnWakeWord = true
    /// See `waitsInKernelWhileRegistered`. Under `lock`.
    private var kernelWaitWhileRegistered = false
    /// See `spinsForPrecision`. Under `lock`.
    private var precise = true
    /// Owner thread only: the backend's reports of the current wait.
    private var completions: [KernelCompletion] = []

    /// A registry over `backend`.
    package init(backend: any EventBackend) {
        self.backend = backend
    }

    /// A registry over a new backend of `kind` (nil: the preferred kind).
    /// Throws when the kernel refuses it.
    package convenience init(kind: EventBackendKind? = nil) throws(SystemCallError) {
        self.init(backend: try EventBackends.makeBackend(kind))
    }

    /// Which kernel interface it sleeps in.
    package var kind: EventBackendKind { backend.kind }

    /// Whether the owner's waits stay in the kernel while any descriptor is
    /// registered, even when none of their watches is pending (false by
    /// default). For a registry whose one-shot watches other threads re-arm
    /// (`rearmNow`) while the owner waits, as the event reactor's are: on
    /// epoll a re-arm then reaches the owner's kernel wait directly, where a
    /// wait on the wake word would need a futex wake-up per re-arm, and
    /// the short spin before it would burn CPU on every event. The cost: a
    /// timed wait then ends in the kernel at its deadline, without the wake
    /// word's early wake and spin (`WakeLead`), so a timer is
    /// as late as the CPU is slow to wake. Any thread.
    package var waitsInKernelWhileRegistered: Bool {
        get { lock.withLock { kernelWaitWhileRegistered } }
        set { lock.withLock { kernelWaitWhileRegistered = newValue } }
    }

    /// Whether a wait on the wake word (no descriptor watched) spins: briefly
    /// before it sleeps, for a wake on its way, and through the learned lead
    /// before a deadline (`WakeLead`), so that a timer fires within a few
    /// microseconds of it (true by default: a loop's). False: it sleeps
    /// until the deadline and spins nothing, so a timer costs one wake-up
    /// and is as late as the CPU is slow to wake (the pool's poller: queue
    /// timers are Dispatch's, whose precision is a wake-up too). Any thread.
    package var spinsForPrecision: Bool {
        get { lock.withLock { precise } }
        set { lock.withLock { precise = newValue } }
    }

    // MARK: Registrations (any thread)

    /// Registers interest in `fd` and arms it. Any thread; the kernel learns
    /// of it at the owner's next `wait` or `applyChanges`. Returns a token,
    /// never 0, unique for the registry's life.
    ///
    /// Throws, naming the descriptor, when `fd` is not open (EBADF) or is a
    /// regular file or a directory (EPERM: always ready, so nothing could be
    /// waited for; epoll refuses them and io_uring would report them ready
    /// without end). `interest` must be readable and/or writable.
    package func register(_ fd: Int32, for interest: Readiness) throws(DescriptorWatchError) -> UInt64 {
        require(
            !interest.isEmpty && interest.isSubset(of: [.readable, .writable]),
            "EventRegistry.register: `interest` must be readable and/or writable")
        try Self.checkWatchable(fd)
        return lock.withLock {
            let token = nextToken
            nextToken += 1
            registrations[token] = Registration(fd: fd, interest: interest, armed: true)
            descriptors[fd, default: Descriptor()].tokens.append(token)
            descriptors[fd]!.joined = true
            markDirty(fd)
            return token
        }
    }

    /// Whether `fd` can be waited on: open, and not a regular file or directory.
    static func checkWatchable(_ fd: Int32) throws(DescriptorWatchError) {
        let type = cshims_fd_type(fd)
        if type < 0 { throw DescriptorWatchError(descriptor: fd, reason: .notOpen, code: -type) }
        if type == CSHIMS_FD_REGULAR || type == CSHIMS_FD_DIRECTORY {
            throw DescriptorWatchError(descriptor: fd, reason: .alwaysReady, code: EPERM)
        }
    }

    /// Ends the registration `token`. Any thread; idempotent. Once it
    /// returns, `wait` reports nothing more for `token`. The kernel watch is
    /// removed at the owner's next `wait` or `applyChanges`.
    package func deregister(_ token: UInt64) {
        lock.withLock {
            guard let r = registrations.removeValue(forKey: token) else { return }
            descriptors[r.fd]?.tokens.removeAll { $0 == token }
            failures.removeAll { $0.token == token }
            markDirty(r.fd)
        }
    }

    /// Arms `token` again after it was reported. Any thread; a no-op for a
    /// registration that is armed or gone.
    package func rearm(_ token: UInt64) {
        lock.withLock {
            guard var r = registrations[token], !r.armed else { return }
            r.armed = true
            registrations[token] = r
            markDirty(r.fd)
        }
    }

    /// Arms `token` again after it was reported and, on epoll (whose
    /// `epoll_ctl` any thread may call), tells the kernel at once, so that an
    /// owner asleep in the kernel sees the descriptor without being woken.
    /// Returns whether the change still needs the owner: always on io_uring
    /// (only its owner thread submits), and on epoll when the owner may be
    /// asleep on the wake word rather than in the kernel. A caller on
    /// another thread then calls `wake()`. Any thread; a no-op (false) for a
    /// registration that is armed or gone.
    package func rearmNow(_ token: UInt64) -> Bool {
        lock.withLock {
            guard var r = registrations[token], !r.armed else { return false }
            r.armed = true
            registrations[token] = r
            guard backend.kind == .epoll else {
                markDirty(r.fd)
                return true
            }
            reconcile(r.fd)
            return ownerMaySleepOnWakeWord
        }
    }

    /// Whether `token` is registered and armed (waiting for a report).
    package func isArmed(_ token: UInt64) -> Bool {
        lock.withLock { registrations[token]?.armed ?? false }
    }

    /// How many registrations there are, and on how many descriptors.
    package var counts: (registrations: Int, descriptors: Int) {
        lock.withLock { (registrations.count, descriptors.count) }
    }

    /// Under `lock`.
    private func markDirty(_ fd: Int32) {
        guard descriptors[fd]?.queued == false else { return }
        descriptors[fd]!.queued = true
        dirty.append(fd)
    }

    // MARK: Owner thread

    /// Tells the kernel what changed since the last call: watches
    /// descriptors newly armed, drops watches no registration wants, and
    /// records failures for the next `wait`. Owner thread only. Takes the
    /// registry's lock for the duration (epoll_ctl system calls on epoll; no
    /// system call on io_uring, which submits with its next wait).
    package func applyChanges() {
        lock.withLock { applyChangesLocked() }
    }

    /// `applyChanges` with `lock` held.
    private func applyChangesLocked() {
        guard !dirty.isEmpty else { return }
        for fd in dirty { reconcile(fd) }
        dirty.removeAll(keepingCapacity: true)
    }

    /// Makes `fd`'s kernel watch match its armed registrations. Under `lock`.
    private func reconcile(_ fd: Int32) {
        guard var d = descriptors[fd] else { return }
        d.queued = false
        let joined = d.joined
        d.joined = false
        var wanted: Readiness = []
        for t in d.tokens where registrations[t]!.armed { wanted.formUnion(registrations[t]!.interest) }
        defer { descriptors[fd] = d.tokens.isEmpty && d.watch == nil ? nil : d }
        if wanted.isEmpty {
            if let w = d.watch {
                backend.unwatch(fd, current: w)
                if w.pending { pendingWatches -= 1 }
                d.watch = nil
            }
            return
        }
        if let w = d.watch, w.pending, d.watched == wanted, !joined { return }
        generation = generation == .max ? 1 : generation + 1
        let key = UInt64(generation) << 32 | UInt64(UInt32(bitPattern: fd))
        let rc = backend.watch(fd, for: wanted, key: key, replacing: d.watch)
        if d.watch?.pending == true { pendingWatches -= 1 }
        if rc == 0 {
            d.watch = KernelWatch(key: key, pending: true)
            d.watched = wanted
            pendingWatches += 1
            for t in d.tokens { registrations[t]!.covered = true }
        } else {
            d.watch = nil
            let reason: DescriptorWatchError.Reason = rc == -EBADF ? .notOpen : rc == -EPERM ? .alwaysReady : .kernelRefused
            let error = DescriptorWatchError(descriptor: fd, reason: reason, code: -rc)
            failures += fail(&d, with: error)
        }
    }

    /// Disarms every armed registration of `d`; returns a failure report
    /// for each. Under `lock`.
    private func fail(_ d: inout Descriptor, with error: DescriptorWatchError, coveredOnly: Bool = false) -> [ReadyEvent] {
        var out: [ReadyEvent] = []
        for t in d.tokens where registrations[t]!.armed && (!coveredOnly || registrations[t]!.covered) {
            registrations[t]!.armed = false
            out.append(ReadyEvent(token: t, readiness: [], failure: error))
        }
        return out
    }

    /// Waits until a registration is reported, `wake()` is called, or
    /// `deadline` passes (nil: no limit; a past deadline only polls), after
    /// applying changes. Appends reports and failures to `events` and returns
    /// whether a wake was seen. Owner thread only; blocks it. A signal that
    /// interrupts the kernel wait is absorbed (the wait goes on, to the same
    /// deadline).
    ///
    /// With no descriptor watched (and none registered, if
    /// `waitsInKernelWhileRegistered`) it sleeps on the wake word instead of
    /// in the kernel, after a brief spin for a wake already on its way
    /// (`LoopWakeState.spinBeforeSleep`) unless not `spinsForPrecision`.
    package func wait(until deadline: MonotonicClock.Instant?, events: inout [ReadyEvent]) -> Bool {
        // One hold of the lock: apply the changes, take the failures they
        // found, and learn whether any watch is in the kernel.
        let (failed, watching, precise): (Bool, Bool, Bool) = lock.withLock {
            applyChangesLocked()
            let failed = !failures.isEmpty
            if failed {
                events += failures
                failures.removeAll()
            }
            let watching = pendingWatches > 0 || (kernelWaitWhileRegistered && !registrations.isEmpty)
            ownerMaySleepOnWakeWord = !watching
            return (failed, watching, self.precise)
        }
        var timeout = failed ? 0 : timeoutNanoseconds(until: deadline)
        // A poll with no watch in the kernel and nothing to submit: the
        // kernel has nothing to report, so it is not asked (a loop's pass
        // that only polls, as after running a perform, costs no system
        // call). A wake stays pending for the next wait, as for any poll.
        if timeout == 0 && !watching && !backend.hasUnsubmittedChanges { return false }
        var woken = false
        if timeout != 0 {
            let kernelWork = watching || backend.hasUnsubmittedChanges
            switch wakeState.waitBeforeKernel(until: deadline, descriptorsArmed: kernelWork, precise: precise) {
            case .woken:
                // Do not delay descriptors that are ready too.
                if !kernelWork { return true }
                timeout = 0
                woken = true
            case .timedOut:
                // The deadline passed on the wake word: as for a poll above,
                // with nothing in the kernel there is nothing to collect (a
                // loop's or the pool poller's timer firing costs no
                // `epoll_wait`).
                if !kernelWork { return false }
                timeout = 0  // still collect anything ready below
            case .sleepInKernel:
                break
            }
        }
        // A poll (timeout 0) does not announce sleep; a wake meanwhile stays
        // pending for the next wait.
        let sleeping = timeout != 0 && wakeState.enterSleep()
        if timeout != 0 && !sleeping {
            timeout = 0
            woken = true
        }
        completions.removeAll(keepingCapacity: true)
        kernelWait: while true {
            wakeState.noteWait()
            let (rc, fired) = backend.enterKernel(timeoutNanoseconds: timeout, completions: &completions)
            if fired { woken = true }
            if rc == 0 || !completions.isEmpty || woken { break }
            switch -rc {
            case EINTR, EAGAIN, EBUSY, ENOMEM:
                // A signal, or the kernel short of resources for a moment:
                // wait again for what is left of the time.
                if timeout > 0 { timeout = timeoutNanoseconds(until: deadline) }
                if timeout == 0 { break kernelWait }
            default:
                misuse("EventRegistry.wait: \(backend.kind.rawValue) wait failed: \(errnoDescription(-rc))")
            }
        }
        if sleeping && wakeState.leaveSleep() { woken = true }
        if !completions.isEmpty { deliver(into: &events) }
        return woken
    }

    /// Turns the backend's completions into reports. Under `lock`.
    private func deliver(into events: inout [ReadyEvent]) {
        lock.withLock {
            for c in completions {
                let fd = Int32(bitPattern: UInt32(truncatingIfNeeded: c.key))
                // A report from an older watch of this number: dropped.
                guard var d = descriptors[fd], let w = d.watch, w.key == c.key, w.pending else { continue }
                d.watch!.pending = false
                pendingWatches -= 1
                if c.result < 0 {
                    let code = -c.result
                    if code == ECANCELED {
                        markDirtyAfter(&d, fd)
                    } else {
                        d.watch = nil
                        let reason: DescriptorWatchError.Reason = code == EBADF ? .notOpen : .kernelRefused
                        // Only the registrations the watch was made for: one
                        // that joined since (the number closed and reused)
                        // gets a watch of its own.
                        events += fail(
                            &d, with: DescriptorWatchError(descriptor: fd, reason: reason, code: code), coveredOnly: true)
                        if d.tokens.contains(where: { registrations[$0]!.armed }) { markDirtyAfter(&d, fd) }
                    }
                } else {
                    let ready = Readiness(rawValue: UInt32(c.result))
                    var stillArmed = false
                    for t in d.tokens where registrations[t]!.armed {
                        let hit = ready.intersection(registrations[t]!.interest.union([.error, .hangup]))
                        if hit.isEmpty || !registrations[t]!.covered {
                            stillArmed = true
                        } else {
                            registrations[t]!.armed = false
                            events.append(ReadyEvent(token: t, readiness: hit))
                        }
                    }
                    if stillArmed { markDirtyAfter(&d, fd) }
                }
                descriptors[fd] = d.tokens.isEmpty && d.watch == nil ? nil : d
            }
        }
    }

    /// Queues `d` (at `fd`) to be watched again. Under `lock`.
    private func markDirtyAfter(_ d: inout Descriptor, _ fd: Int32) {
        guard !d.queued else { return }
        d.queued = true
        dirty.append(fd)
    }

    // MARK: Waking (any thread)

    /// Wakes the owner if it sleeps in `wait`, or makes its next `wait`
    /// return at once. Any thread; never blocks; a system call only when the
    /// owner is asleep. Release ordering: what the caller wrote before is
    /// visible to the owner after its `wait` returns.
    package func wake() {
        if wakeState.requestWake() { backend.signalWaker() }
    }

    /// The registry's counters.
    package var statistics: EventBackendStatistics { wakeState.statistics }
}

/// Relative nanoseconds until `deadline` for a kernel wait: -1 for none,
/// 0 for a deadline already past.
func timeoutNanoseconds(until deadline: MonotonicClock.Instant?) -> Int64 {
    guard let deadline, !deadline.isDistantFuture else { return -1 }
    return max(0, deadline.nanoseconds &- MonotonicClock.now.nanoseconds)
}
