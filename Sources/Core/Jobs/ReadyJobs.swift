/// A `JobQueue`'s jobs that became ready and have not been handed to a
/// worker: one first-in-first-out lane per queue priority, taken highest
/// lane first. Each lane is a list linked through the jobs themselves
/// (`Job.readyNext`), so listing a job allocates nothing. Not synchronized:
/// the queue's lock guards it, and the jobs' list fields.
///
/// A job is listed at most once (`Job.isListedReady`). A listed job may no
/// longer be ready (a dependency added after it was listed): `popStartable`
/// drops such entries, and the job is listed again when it becomes ready.
/// The job's own claim (`Job.run(byQueue:)`) is the final word.
struct ReadyJobs {
    private var heads: [Job?] = Array(repeating: nil, count: 5)
    private var tails: [Job?] = Array(repeating: nil, count: 5)

    mutating func append(_ job: Job) {
        guard !job.isListedReady else { return }
        job.isListedReady = true
        let lane = job.frozenQueueLane
        if let tail = tails[lane] { tail.readyNext = job } else { heads[lane] = job }
        tails[lane] = job
    }

    /// The first startable job of the highest non-empty lane, or nil.
    mutating func popStartable() -> Job? {
        var lane = 4
        while lane >= 0 {
            while let job = heads[lane] {
                heads[lane] = job.readyNext
                if heads[lane] == nil { tails[lane] = nil }
                job.readyNext = nil
                job.isListedReady = false
                if job.isStartableHint { return job }
            }
            lane -= 1
        }
        return nil
    }
}
