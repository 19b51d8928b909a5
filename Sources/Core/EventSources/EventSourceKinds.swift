extension EventSource {
    /// The kinds of event a source watches.
    public enum Kind: Sendable, Hashable {
        /// A timer: `data` counts the firings since the last call.
        case timer
        /// A descriptor has data to read: `data` estimates the bytes.
        case read
        /// A descriptor can take data: `data` estimates the space.
        case write
        /// A signal arrived: `data` counts the deliveries.
        case signal
        /// A process exited: `data` holds `ProcessEvents`.
        case process
        /// A file changed: `data` holds `FileEvents`.
        case fileSystemObject
        /// Data the program merges in with `merge(data:)`.
        case data(DataMerge)
    }

    /// How a data source combines the values merged between handler calls.
    public enum DataMerge: Sendable, Hashable {
        /// Summed (wrapping at 2^64).
        case add
        /// ORed, under the source's mask.
        case or
        /// The latest value wins.
        case replace
    }

    /// Where a source's handlers run.
    public enum Target: Sendable {
        /// As work items on a queue (any kind: serial, concurrent, global,
        /// main).
        case queue(WorkQueue)
        /// On a run loop's thread, during passes in one of `modes`.
        case loop(ThreadLoop, modes: [LoopMode] = [.common])
    }

    /// The clock a timer's schedule follows.
    public enum TimerStart: Sendable, Hashable {
        /// The monotonic clock (`CLOCK_MONOTONIC`): does not advance while
        /// the machine sleeps, never jumps.
        case monotonic(MonotonicClock.Instant)
        /// The wall clock (`CLOCK_REALTIME`): follows changes to the
        /// system time, for schedules tied to the calendar. When the time is
        /// set, the timer is rescheduled at once: set past its due time, it
        /// fires at once (a repeating one with `data` counting the periods
        /// passed); set back, it waits until the wall clock reaches its due
        /// time again.
        case wall(WallClock.Instant)

        /// Now, on the monotonic clock.
        public static var now: TimerStart { .monotonic(MonotonicClock.now) }
    }

    /// Changes to a file-system object, as a `.fileSystemObject` source
    /// watches and reports them. Linux reports them through inotify on the
    /// open descriptor's inode (so the source follows the file, not its
    /// name); what maps to what:
    ///
    /// | event | inotify | reported when |
    /// |---|---|---|
    /// | `write` | `IN_MODIFY` | a write or a truncation (not told apart) |
    /// | `write` (a directory) | `IN_CREATE`, `IN_DELETE`, `IN_MOVED_FROM`, `IN_MOVED_TO` | an entry made, removed or renamed |
    /// | `extend` | `IN_MODIFY` | the size grew since the last event |
    /// | `attributes` | `IN_ATTRIB` | mode, owner, times, links changed |
    /// | `link` | `IN_ATTRIB` | the link count changed |
    /// | `delete` | `IN_ATTRIB` / `IN_DELETE_SELF` | the link count reached 0 |
    /// | `rename` | `IN_MOVE_SELF` | any rename of the file |
    /// | `revoke` | `IN_UNMOUNT` | its file system was unmounted |
    ///
    /// On a directory, the changes of its entries are what a watch is for,
    /// and they are reported as a kqueue vnode source on a directory reports
    /// them: an entry made, removed, or renamed within, into or out of it
    /// (inotify's `IN_CREATE`, `IN_DELETE`, `IN_MOVED_FROM`, `IN_MOVED_TO`)
    /// is `write`; when that changes the directory's link count (a
    /// subdirectory made or removed) it is `link` too. Changes inside an
    /// entry (a write to a file in the directory) are not the directory's
    /// and are not reported; nor is its size (`extend` never occurs on a
    /// directory). `attributes`, `rename` and `delete` mean what they mean
    /// for a file.
    ///
    /// With the descriptor open (as a source needs), deleting the last name
    /// gives only an attribute change with link count 0; that is reported as
    /// `delete` (with `attributes` and `link`). `revoke` cannot happen while
    /// the descriptor is open: Linux refuses to unmount a busy file system
    /// (`EBUSY`) and a lazy unmount reports nothing until the last
    /// descriptor closes. Darwin's unlock event has no Linux counterpart and
    /// is not offered.
    public struct FileEvents: OptionSet, Sendable, Hashable {
        public let rawValue: UInt64
        public init(rawValue: UInt64) { self.rawValue = rawValue }
        public static let delete = FileEvents(rawValue: 1 << 0)
        public static let write = FileEvents(rawValue: 1 << 1)
        public static let extend = FileEvents(rawValue: 1 << 2)
        public static let attributes = FileEvents(rawValue: 1 << 3)
        public static let link = FileEvents(rawValue: 1 << 4)
        public static let rename = FileEvents(rawValue: 1 << 5)
        public static let revoke = FileEvents(rawValue: 1 << 6)
        /// Every event Linux can report.
        public static let all: FileEvents = [.delete, .write, .extend, .attributes, .link, .rename, .revoke]
    }

    /// Events of a process, as a `.process` source reports them. Linux lets
    /// an unprivileged process observe only `exit` (through a pidfd);
    /// `fork`, `exec` and `signal` of another process need the netlink
    /// process connector (`CAP_NET_ADMIN`) or ptrace, so asking for them is
    /// refused at creation with `EventSourceError.processEventsNotObservable`.
    public struct ProcessEvents: OptionSet, Sendable, Hashable {
        public let rawValue: UInt64
        public init(rawValue: UInt64) { self.rawValue = rawValue }
        public static let exit = ProcessEvents(rawValue: 1 << 0)
        public static let fork = ProcessEvents(rawValue: 1 << 1)
        public static let exec = ProcessEvents(rawValue: 1 << 2)
        public static let signal = ProcessEvents(rawValue: 1 << 3)
    }

    /// How a child process ended.
    public enum ExitStatus: Sendable, Hashable {
        /// It called `exit` with this status.
        case exited(Int32)
        /// A signal killed it (`coreDumped`: and it dumped core).
        case signaled(Int32, coreDumped: Bool)
    }

    // MARK: Making sources

    /// A timer source: fires at `start`, then every `interval` (once if
    /// `interval` is nil). A repeating timer keeps to start + n × interval;
    /// firings it misses (a busy target, a suspension) merge into one call
    /// whose `data` counts them. `leeway` lets Spindle fire it up to that
    /// much late so that nearby timers share a wake-up; it never fires
    /// early. No timerfd each: the timers of sources on work queues share
    /// one heap behind one deadline, that of the idle pool worker that
    /// watches the queue sources (it runs the handler itself); a source on a run
    /// loop is one of that loop's timers, so it fires only in its modes.
    ///
    /// A wall-clock schedule is translated to the monotonic clock when the
    /// timer is armed and again at each firing, which is checked against the
    /// wall clock (never early). A change of the system time is noticed at
    /// once, as Dispatch's `CLOCK_REALTIME` timers notice it: while a
    /// wall-clock timer is active, a timerfd armed with
    /// `TFD_TIMER_CANCEL_ON_SET` (one for the process, on the reactor
    /// thread) reports each setting of the clock, and every wall-clock
    /// timer is translated again; one whose due time has passed fires at
    /// once, one whose due time moved later waits for it. A gradual
    /// adjustment (NTP slewing) is no setting and needs none of this. If the
    /// kernel refuses that timerfd (`timerfd_create`, e.g. `EMFILE`), the
    /// source fails with `EventSourceError.systemCall` (see `failure`).
    ///
    /// A repeating timer uses at most half its `interval` as leeway (a larger
    /// one, even `Duration.seconds(Int64.max)`, means "as late as that"),
    /// as Dispatch bounds it: so it still fires every period. A one-shot's
    /// leeway is used as given.
    ///
    /// **While its call cannot start** (the source or its queue suspended,
    /// the queue busy, the previous call still running) the timer is
    /// disarmed: it fires once, then costs nothing until that call runs,
    /// whose `data` counts every due time up to its start; the timer is
    /// armed again when the call returns. The handler never sees more than
    /// one call's worth of firings at a time, and no wake-ups are spent on
    /// a timer nobody can serve.
    ///
    /// A start in the past fires at once, its `data` counting the periods
    /// since then: a monotonic start may be any instant (even one near
    /// `Int64.min` nanoseconds, long before the clock's start), a
    /// wall-clock one any instant from 1677-09-21 (2^63 nanoseconds before
    /// 1970, where the schedule's count begins) on; a wall-clock start after
    /// 2262-04-11 never comes.
    ///
    /// `interval` must be positive, `leeway` non-negative, and a wall-clock
    /// `start` not before 1677-09-21 00:12:44 UTC: otherwise a precondition
    /// failure with a message naming the argument.
    public static func timer(
        start: TimerStart = .now, interval: Duration?, leeway: Duration = .zero, on target: Target
    ) -> EventSource {
        if let interval {
            require(interval > .zero, "EventSource.timer: `interval` is \(interval); a repeating timer needs a positive interval (nil for one firing)")
        }
        require(leeway >= .zero, "EventSource.timer: `leeway` is \(leeway); it cannot be negative")
        if case .wall(let first) = start {
            require(
                TimerWatch.nanoseconds(first) != nil || first.secondsSinceEpoch > 0,
                "EventSource.timer: `start` is \(first); a wall-clock start cannot be before 1677-09-21 00:12:44 UTC (-9223372036.854775808 s since 1970), the earliest time a timer's schedule counts from")
        }
        return EventSource(
            kind: .timer, handle: 0, mask: 0, target: target,
            watch: TimerWatch(start: start, interval: interval, leeway: leeway))
    }

    /// A source that fires while `descriptor` has data to read, with `data`
    /// the bytes readable (`FIONREAD`; for a regular file, its size less the
    /// file offset; 1 where the kernel cannot tell, e.g. a listening
    /// socket). At end of file (a pipe or socket whose peer closed, a regular
    /// file read to its end) it fires once with `data` 0 and then stays
    /// quiet until cancelled. Level-triggered otherwise: while data remains
    /// unread, it fires again after each call.
    ///
    /// The descriptor stays the caller's: the source never closes it (close
    /// it in the cancel handler) and never changes its flags; make it
    /// non-blocking, or a read in the handler can stall the target.
    ///
    /// - Throws: `EventSourceError.descriptorNotOpen` if it is not open.
    public static func read(descriptor: Int32, on target: Target) throws(EventSourceError) -> EventSource {
        let watch = try DescriptorWatch(descriptor: descriptor, writing: false)
        return EventSource(kind: .read, handle: descriptor, mask: 0, target: target, watch: watch)
    }

    /// A source that fires while `descriptor` can take data, with `data` the
    /// space (a socket's send buffer less what it holds, a pipe's capacity
    /// less its contents; 1 for other kinds, such as a regular file, which is
    /// always writable). Fires again after each call while space remains:
    /// cancel it (or suspend it) when there is nothing more to write. The
    /// descriptor stays the caller's, as for `read(descriptor:on:)`.
    ///
    /// - Throws: `EventSourceError.descriptorNotOpen` if it is not open.
    public static func write(descriptor: Int32, on target: Target) throws(EventSourceError) -> EventSource {
        let watch = try DescriptorWatch(descriptor: descriptor, writing: true)
        return EventSource(kind: .write, handle: descriptor, mask: 0, target: target, watch: watch)
    }

    /// A source that observes deliveries of `signal` to the process; `data`
    /// counts them since the last call. It only observes: what the
    /// program's disposition for the signal meant still happens (its own
    /// handler runs; `SIG_IGN` ignores; `SIG_DFL` terminates, stops or
    /// ignores as the default would), and the disposition is put back when
    /// the last source for the signal is cancelled. No signal mask is
    /// changed, so it works whichever thread the kernel picks.
    ///
    /// Counts are exact up to the kernel's own merging: deliveries of a
    /// standard signal that arrive while one is already pending become one;
    /// real-time signals queue and are all counted.
    ///
    /// The observer never fights the program for the signal: a disposition
    /// the program sets after the first source started replaces the
    /// observer (the sources then see nothing) and is left in place when
    /// they are cancelled; a signal the program blocks in every thread (to
    /// take it with `sigwait` or `signalfd`) stays the program's, and the
    /// sources see no deliveries. In a child after `fork()` the observer
    /// stays installed and keeps doing what the saved disposition meant;
    /// the parent's sources are not the child's.
    ///
    /// - Throws: `EventSourceError.signalNotObservable` for SIGKILL and
    ///   SIGSTOP (uncatchable), SIGILL, SIGBUS, SIGSEGV and SIGFPE (faults
    ///   of the thread that raised them), 32 and 33 (the C library's own),
    ///   and numbers out of range; `.systemCall` if the kernel refuses.
    public static func signal(_ signal: Int32, on target: Target) throws(EventSourceError) -> EventSource {
        try SignalWatch.validate(signal)
        return EventSource(kind: .signal, handle: signal, mask: 0, target: target, watch: SignalWatch(signal: signal))
    }

    /// A source that fires once when process `pid` exits (`data` =
    /// `ProcessEvents.exit`). For a child of this process, `exitStatus`
    /// then tells how it ended (it is not reaped). Rests on a pidfd
    /// (`pidfd_open`, Linux 5.3), which the source owns and closes.
    ///
    /// - Throws: `.processEventsNotObservable` if `events` holds anything
    ///   but `.exit`; `.noSuchProcess` if `pid` does not exist;
    ///   `.systemCall` if the kernel refuses.
    public static func process(
        _ pid: Int32, events: ProcessEvents = .exit, on target: Target
    ) throws(EventSourceError) -> EventSource {
        let watch = try ProcessWatch(pid: pid, events: events)
        return EventSource(kind: .process, handle: pid, mask: events.rawValue, target: target, watch: watch)
    }

    /// A source that reports `events` of the file-system object open on
    /// `descriptor` (`data` = the `FileEvents` that occurred, ORed since the
    /// last call; see `FileEvents` for what Linux can tell apart, and what a
    /// directory reports when its entries change). It follows
    /// the file, not its name. The descriptor must stay open while the
    /// source runs; the source never closes it.
    ///
    /// - Throws: `.descriptorNotOpen`; `.systemCall` if inotify refuses
    ///   (e.g. the `max_user_watches` limit).
    public static func fileSystemObject(
        descriptor: Int32, events: FileEvents, on target: Target
    ) throws(EventSourceError) -> EventSource {
        require(!events.isEmpty, "EventSource.fileSystemObject: `events` is empty; the source could never fire")
        let watch = try FileSystemWatch(descriptor: descriptor, events: events)
        return EventSource(
            kind: .fileSystemObject, handle: descriptor, mask: events.rawValue, target: target, watch: watch)
    }

    /// A data source: the program calls `merge(data:)` from any thread, and
    /// the handler gets what was merged since its last call (summed, ORed
    /// under `mask`, or the latest, by `merge`). No kernel object: a merge
    /// is two atomic operations, and a wake-up only when it makes the first
    /// pending call.
    public static func data(_ merge: DataMerge, mask: UInt64 = .max, on target: Target) -> EventSource {
        EventSource(kind: .data(merge), handle: 0, mask: merge == .or ? mask : 0, target: target, watch: nil)
    }
}

extension EventSource.FileEvents: CustomStringConvertible {
    /// The events by name, e.g. `[write, extend]`.
    public var description: String {
        let names: [(Self, String)] = [
            (.delete, "delete"), (.write, "write"), (.extend, "extend"), (.attributes, "attributes"),
            (.link, "link"), (.rename, "rename"), (.revoke, "revoke"),
        ]
        return "[" + names.filter { contains($0.0) }.map(\.1).joined(separator: ", ") + "]"
    }
}

extension EventSource.ProcessEvents: CustomStringConvertible {
    /// The events by name, e.g. `[exit]`.
    public var description: String {
        let names: [(Self, String)] = [(.exit, "exit"), (.fork, "fork"), (.exec, "exec"), (.signal, "signal")]
        return "[" + names.filter { contains($0.0) }.map(\.1).joined(separator: ", ") + "]"
    }
}
