# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_dlqctl_global_optspecs
    string join \n o/output= color= config= q/quiet timeout= h/help V/version
end

function __fish_dlqctl_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_dlqctl_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_dlqctl_using_subcommand
    set -l cmd (__fish_dlqctl_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c dlqctl -n "__fish_dlqctl_needs_command" -s o -l output -d 'Output format' -r -f -a "table\t'Aligned columns for a terminal'
json\t'Stable JSON: one object for reports, one line per message for streams'"
complete -c dlqctl -n "__fish_dlqctl_needs_command" -l color -d 'When to colour output' -r -f -a "auto\t'Colour when stdout is a terminal and NO_COLOR is not set'
always\t''
never\t''"
complete -c dlqctl -n "__fish_dlqctl_needs_command" -l config -d 'Config file with named targets and redaction rules [default: $XDG_CONFIG_HOME/dlqctl/config.toml]' -r -F
complete -c dlqctl -n "__fish_dlqctl_needs_command" -l timeout -d 'Longest wait, in seconds, for any one answer from a broker (connect, read, publish, settle) before the run stops with an error instead of hanging on a stalled connection' -r
complete -c dlqctl -n "__fish_dlqctl_needs_command" -s q -l quiet -d 'Print no notes on stderr, only errors'
complete -c dlqctl -n "__fish_dlqctl_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlqctl -n "__fish_dlqctl_needs_command" -s V -l version -d 'Print version'
complete -c dlqctl -n "__fish_dlqctl_needs_command" -f -a "list" -d 'Discover DLQs and the queues that feed them (for an archive: its one-line description)'
complete -c dlqctl -n "__fish_dlqctl_needs_command" -f -a "peek" -d 'Look at dead letters without consuming them'
complete -c dlqctl -n "__fish_dlqctl_needs_command" -f -a "summarize" -d 'Count dead letters by reason, source, exception or age'
complete -c dlqctl -n "__fish_dlqctl_needs_command" -f -a "export" -d 'Stream every dead letter as JSONL, with bounded memory'
complete -c dlqctl -n "__fish_dlqctl_needs_command" -f -a "redrive" -d 'Move dead letters back to their source (or --to elsewhere), safely: plan, confirm, throttle, confirm-before-settle, audit log, resumable'
complete -c dlqctl -n "__fish_dlqctl_needs_command" -f -a "lint" -d 'Check DLQ configuration and alerting, live or from templates and rule files (exit 3 on findings)'
complete -c dlqctl -n "__fish_dlqctl_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand list" -s o -l output -d 'Output format' -r -f -a "table\t'Aligned columns for a terminal'
json\t'Stable JSON: one object for reports, one line per message for streams'"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand list" -l color -d 'When to colour output' -r -f -a "auto\t'Colour when stdout is a terminal and NO_COLOR is not set'
always\t''
never\t''"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand list" -l config -d 'Config file with named targets and redaction rules [default: $XDG_CONFIG_HOME/dlqctl/config.toml]' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand list" -l timeout -d 'Longest wait, in seconds, for any one answer from a broker (connect, read, publish, settle) before the run stops with an error instead of hanging on a stalled connection' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand list" -s q -l quiet -d 'Print no notes on stderr, only errors'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -l where -d 'Only messages matching EXPR; repeat to AND several. FIELD=VALUE, FIELD!=VALUE, FIELD~REGEX, FIELD!~REGEX, age>2h, count>=3; fields: reason, exception, source, dlq, id, count, age, header.NAME, body.PATH' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -l max-line-mib -d 'The longest archive line read, in MiB: a longer one (a file that is not an archive, a stream that never ends a line) stops the read' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -l reason-from -d 'Take the exception class from an application\'s own field: header:NAME (attr:NAME is the same, for SQS attributes) or body.PATH of a JSON body. Used by peek, summarize, export' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -s n -l limit -d 'How many dead letters to show' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -l redact -d 'Replace a field\'s value before output: header.NAME, body.PATH (dotted), or NAME for both. Repeatable; adds to the config file\'s [redact] fields' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -s o -l output -d 'Output format' -r -f -a "table\t'Aligned columns for a terminal'
json\t'Stable JSON: one object for reports, one line per message for streams'"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -l color -d 'When to colour output' -r -f -a "auto\t'Colour when stdout is a terminal and NO_COLOR is not set'
always\t''
never\t''"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -l config -d 'Config file with named targets and redaction rules [default: $XDG_CONFIG_HOME/dlqctl/config.toml]' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -l timeout -d 'Longest wait, in seconds, for any one answer from a broker (connect, read, publish, settle) before the run stops with an error instead of hanging on a stalled connection' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -l skip-invalid -d 'Skip archive lines that are not dead letters, and report how many, instead of stopping'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -l from-beginning -d 'Kafka: read from the earliest retained record instead of the group\'s committed offset'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -l force -d 'Read even where reading can dead-letter messages again (a RabbitMQ quorum DLQ with a delivery limit counts every read as a delivery)'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -l full -d 'Show whole bodies and every header instead of a one-line preview'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -s q -l quiet -d 'Print no notes on stderr, only errors'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand peek" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -l where -d 'Only messages matching EXPR; repeat to AND several. FIELD=VALUE, FIELD!=VALUE, FIELD~REGEX, FIELD!~REGEX, age>2h, count>=3; fields: reason, exception, source, dlq, id, count, age, header.NAME, body.PATH' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -l max-line-mib -d 'The longest archive line read, in MiB: a longer one (a file that is not an archive, a stream that never ends a line) stops the read' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -l reason-from -d 'Take the exception class from an application\'s own field: header:NAME (attr:NAME is the same, for SQS attributes) or body.PATH of a JSON body. Used by peek, summarize, export' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -l by -d 'What to group by' -r -f -a "reason\t'The reason kind (rejected, expired, max_receive_count, exception, ...)'
source\t'The queue or topic the message came from'
exception\t'The exception class or error code'
age\t'How long ago it died, in buckets'
exchange\t'The exchange it was first published to (RabbitMQ)'
routing-key\t'Its original routing key(s) (RabbitMQ)'"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -s o -l output -d 'Output format' -r -f -a "table\t'Aligned columns for a terminal'
json\t'Stable JSON: one object for reports, one line per message for streams'"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -l color -d 'When to colour output' -r -f -a "auto\t'Colour when stdout is a terminal and NO_COLOR is not set'
always\t''
never\t''"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -l config -d 'Config file with named targets and redaction rules [default: $XDG_CONFIG_HOME/dlqctl/config.toml]' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -l timeout -d 'Longest wait, in seconds, for any one answer from a broker (connect, read, publish, settle) before the run stops with an error instead of hanging on a stalled connection' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -l skip-invalid -d 'Skip archive lines that are not dead letters, and report how many, instead of stopping'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -l from-beginning -d 'Kafka: read from the earliest retained record instead of the group\'s committed offset'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -l force -d 'Read even where reading can dead-letter messages again (a RabbitMQ quorum DLQ with a delivery limit counts every read as a delivery)'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -s q -l quiet -d 'Print no notes on stderr, only errors'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand summarize" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -l where -d 'Only messages matching EXPR; repeat to AND several. FIELD=VALUE, FIELD!=VALUE, FIELD~REGEX, FIELD!~REGEX, age>2h, count>=3; fields: reason, exception, source, dlq, id, count, age, header.NAME, body.PATH' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -l max-line-mib -d 'The longest archive line read, in MiB: a longer one (a file that is not an archive, a stream that never ends a line) stops the read' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -l reason-from -d 'Take the exception class from an application\'s own field: header:NAME (attr:NAME is the same, for SQS attributes) or body.PATH of a JSON body. Used by peek, summarize, export' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -l file -d 'Write to FILE instead of stdout; it appears only when the export is complete' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -l redact -d 'Replace a field\'s value before output: header.NAME, body.PATH (dotted), or NAME for both. Repeatable; adds to the config file\'s [redact] fields' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -s o -l output -d 'Output format' -r -f -a "table\t'Aligned columns for a terminal'
json\t'Stable JSON: one object for reports, one line per message for streams'"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -l color -d 'When to colour output' -r -f -a "auto\t'Colour when stdout is a terminal and NO_COLOR is not set'
always\t''
never\t''"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -l config -d 'Config file with named targets and redaction rules [default: $XDG_CONFIG_HOME/dlqctl/config.toml]' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -l timeout -d 'Longest wait, in seconds, for any one answer from a broker (connect, read, publish, settle) before the run stops with an error instead of hanging on a stalled connection' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -l skip-invalid -d 'Skip archive lines that are not dead letters, and report how many, instead of stopping'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -l from-beginning -d 'Kafka: read from the earliest retained record instead of the group\'s committed offset'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -l force -d 'Read even where reading can dead-letter messages again (a RabbitMQ quorum DLQ with a delivery limit counts every read as a delivery)'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -s q -l quiet -d 'Print no notes on stderr, only errors'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand export" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l where -d 'Only messages matching EXPR; repeat to AND several. FIELD=VALUE, FIELD!=VALUE, FIELD~REGEX, FIELD!~REGEX, age>2h, count>=3; fields: reason, exception, source, dlq, id, count, age, header.NAME, body.PATH' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l max-line-mib -d 'The longest archive line read, in MiB: a longer one (a file that is not an archive, a stream that never ends a line) stops the read' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l reason-from -d 'Take the exception class from an application\'s own field: header:NAME (attr:NAME is the same, for SQS attributes) or body.PATH of a JSON body. Used by peek, summarize, export' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l to -d 'Send copies here instead of each message\'s own source: a .jsonl archive (replay into a file) or another broker\'s target' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l limit -d 'Move at most N messages' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l rate -d 'Messages per second, evenly paced; \'unlimited\' lifts the limit' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l batch -d 'Messages taken from the DLQ and held unsettled at once (the most a crash can duplicate)' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l plan-out -d 'Save the plan, with the exact message ids, to FILE (JSONL)' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l note -d 'Why this redrive is done, for the audit log' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l audit-log -d 'Audit log path [default: $XDG_STATE_HOME/dlqctl/runs/RUN.audit.jsonl]' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l resume -d 'Continue an interrupted run from its checkpoint, without publishing again what it already had confirmed' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l max-redrives -d 'Skip messages dlqctl has already redriven N times (loop guard)' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l retries -d 'Retries of a transient publish failure, with exponential backoff and jitter' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l mode -d 'How to move: the broker\'s own server-side move (SQS move task: everything back to its source), a client-side move by dlqctl (needed for --where, --to, --limit, --max-redrives), or whichever fits' -r -f -a "auto\t'Server-side when nothing is filtered and everything goes back to its source'
server\t''
client\t''"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l max-consecutive-failures -d 'Stop after N messages in a row could not be delivered (the destination looks down or gone)' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -s o -l output -d 'Output format' -r -f -a "table\t'Aligned columns for a terminal'
json\t'Stable JSON: one object for reports, one line per message for streams'"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l color -d 'When to colour output' -r -f -a "auto\t'Colour when stdout is a terminal and NO_COLOR is not set'
always\t''
never\t''"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l config -d 'Config file with named targets and redaction rules [default: $XDG_CONFIG_HOME/dlqctl/config.toml]' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l timeout -d 'Longest wait, in seconds, for any one answer from a broker (connect, read, publish, settle) before the run stops with an error instead of hanging on a stalled connection' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l skip-invalid -d 'Skip archive lines that are not dead letters, and report how many, instead of stopping'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l from-beginning -d 'Kafka: read from the earliest retained record instead of the group\'s committed offset'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l force -d 'Read even where reading can dead-letter messages again (a RabbitMQ quorum DLQ with a delivery limit counts every read as a delivery)'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l dry-run -d 'Print what would move, and change nothing beyond what reading costs'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -s y -l yes -d 'Do not ask for confirmation (required when there is no terminal to ask on)'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l keep-partition -d 'Kafka: produce each copy to its original partition instead of letting its key decide'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l status -d 'Show the DLQ\'s server-side move task and its progress, then exit'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -l cancel -d 'Cancel the DLQ\'s running server-side move task, then exit'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -s q -l quiet -d 'Print no notes on stderr, only errors'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand redrive" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -l broker -d 'A broker to inventory live (repeatable): sqs:// (?prefix=), rabbitmq://USER:PASS@HOST:PORT/VHOST, kafka://HOST:PORT' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -l template -d 'A CloudFormation template (YAML or JSON) declaring SQS queues and CloudWatch alarms (repeatable)' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -l rules -d 'A Prometheus rule file whose alerting rules watch DLQs by label (repeatable)' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -l alerts -d 'A dlqctl alert file (TOML) describing alerts kept elsewhere (repeatable)' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -l format -d 'Report format (-o json also selects json)' -r -f -a "text\t''
json\t''
sarif\t'SARIF 2.1.0, for GitHub code scanning'"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -l fail-on -d 'Exit 3 when an unwaived finding is at least this severe' -r -f -a "note\t''
warning\t''
error\t''"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -s o -l output -d 'Output format' -r -f -a "table\t'Aligned columns for a terminal'
json\t'Stable JSON: one object for reports, one line per message for streams'"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -l color -d 'When to colour output' -r -f -a "auto\t'Colour when stdout is a terminal and NO_COLOR is not set'
always\t''
never\t''"
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -l config -d 'Config file with named targets and redaction rules [default: $XDG_CONFIG_HOME/dlqctl/config.toml]' -r -F
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -l timeout -d 'Longest wait, in seconds, for any one answer from a broker (connect, read, publish, settle) before the run stops with an error instead of hanging on a stalled connection' -r
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -s q -l quiet -d 'Print no notes on stderr, only errors'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand lint" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand help; and not __fish_seen_subcommand_from list peek summarize export redrive lint help" -f -a "list" -d 'Discover DLQs and the queues that feed them (for an archive: its one-line description)'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand help; and not __fish_seen_subcommand_from list peek summarize export redrive lint help" -f -a "peek" -d 'Look at dead letters without consuming them'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand help; and not __fish_seen_subcommand_from list peek summarize export redrive lint help" -f -a "summarize" -d 'Count dead letters by reason, source, exception or age'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand help; and not __fish_seen_subcommand_from list peek summarize export redrive lint help" -f -a "export" -d 'Stream every dead letter as JSONL, with bounded memory'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand help; and not __fish_seen_subcommand_from list peek summarize export redrive lint help" -f -a "redrive" -d 'Move dead letters back to their source (or --to elsewhere), safely: plan, confirm, throttle, confirm-before-settle, audit log, resumable'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand help; and not __fish_seen_subcommand_from list peek summarize export redrive lint help" -f -a "lint" -d 'Check DLQ configuration and alerting, live or from templates and rule files (exit 3 on findings)'
complete -c dlqctl -n "__fish_dlqctl_using_subcommand help; and not __fish_seen_subcommand_from list peek summarize export redrive lint help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
