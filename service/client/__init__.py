"""The `towerboard` client verbs: drive a running service over its HTTP API.

    towerboard submit SPEC.json [--watch]          submit a job (SPEC "-" reads stdin)
    towerboard status [ID] [--state S] [--json]    the jobs table, or one job in detail
    towerboard logs ID [--tail N] [--follow]       the worker's log
    towerboard cancel ID [ID ...] [--wait]         cancel queued or running jobs
    towerboard resume ID [--steps N | --epochs N | --finish] [--watch]
                                                   train an ended job on, or finish it
                                                   at its latest checkpoint (--finish)
    towerboard resume ID ... --priority N          ... at another priority
    towerboard priority ID N                       a queued or running job's new priority
    towerboard delete ID [ID ...]                  delete ended jobs and their files
    towerboard checkpoints ID [--download STEP]    list checkpoints, or fetch one (.tar.gz)
    towerboard export ID [-o PATH]                 fetch the exported SavedModel (.tar.gz)
    towerboard tensorboard [--jobs ID ...] [--merge] [--open] [--stop]
    towerboard metrics ID [--name SERIES] [--after-step N [--revision R]]
                                                   scalar series as CSV
    towerboard metrics ID [--name SERIES] --into FILE [--follow]
                                                   a CSV file kept in sync with the job
    towerboard profile ID [--steps N]              a device trace of a running job's next steps
    towerboard devices                             each device and the job holding it (id, name)
    towerboard queue [--limit N]                   queued jobs in run order; what the first waits for

Every verb takes `--url` (default `$TOWERBOARD_URL`, else http://127.0.0.1:8000) and sends
`$TOWERBOARD_TOKEN`, when set, as its bearer token. Results go to stdout (`submit` prints
just the job id, so `id=$(towerboard submit spec.json)` works); progress and errors go to
stderr, each error as one line. Exit codes: 0 done; 1 the service refused or failed the
request, or a watched job did not succeed; 2 bad usage or a rejected spec; 3 the service
could not be reached (nothing was sent), or a download was cut off (run it again: it
resumes); 4 a request was sent and no answer came (a timeout, a dropped connection, a
proxy's 502-504), so what it asked may or may not have been done (the error says how to
check before trying again, or what running it again does); 130 interrupted (a
change interrupted before its answer came says so, as for 4); 141 (as a shell reports SIGPIPE) the reader of stdout went away,
as `| head` does, which ends a verb that reads quietly; a verb that changes things makes
all its changes, and says on stderr what stdout would have said. Standard output failing
otherwise (a full disk) is an error of one line, exit 1.

Downloads (`checkpoints --download`, `export`) write `TARGET.part`, renamed to TARGET once
complete; a part left by a download that was cut off or interrupted is resumed by the next
run to the same target, when the service still serves the same archive (its ETag). A
target that is already there is refused (exit 1) unless `--force` is given.

Only httpx and the standard library: the client never imports TensorFlow. Its parts:
`commands` (the verbs' arguments; imports no httpx, so `towerboard serve` does not pay
for the client), `verbs` (what each verb does), `api` (the service's HTTP API),
`display` (tables, progress lines), `downloads` (resumable archive downloads),
`metricsfile` (the CSV file `metrics --into` keeps) and `common` (exit codes, job states,
the one-line error).
"""
