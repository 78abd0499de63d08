"""Reads an experiment directory's TensorBoard event files with TensorBoard's
own readers and prints what they hold as JSON, for tests/tensorboard.rs.

{
  "raw": {run: [[tag, step, value-or-null], ...]},   # every record, in order
  "scalars": {run: {tag: [[step, value], ...]}},      # what TensorBoard shows
  "sessions": {run: {"start": {...}, "end": {...}}}   # the HParams plugin's data
}

`raw` comes from the event file loader (each record's checksums checked),
so a step written twice shows twice there even where the accumulator would
have purged it.
"""

import json
import os
import sys

from google.protobuf import json_format
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.backend.event_processing import event_multiplexer
from tensorboard.plugins.hparams import plugin_data_pb2


def raw_events(logdir):
    out = {}
    for root, _, files in os.walk(logdir):
        for name in sorted(files):
            if "tfevents" not in name:
                continue
            run = os.path.relpath(root, logdir)
            records = out.setdefault(run, [])
            loader = event_file_loader.RawEventFileLoader(os.path.join(root, name))
            from tensorboard.compat.proto import event_pb2

            for raw in loader.Load():
                event = event_pb2.Event.FromString(raw)
                if event.HasField("file_version"):
                    records.append(["file_version", event.step, event.file_version])
                    continue
                for value in event.summary.value:
                    simple = value.simple_value if value.HasField("simple_value") else None
                    records.append([value.tag, event.step, simple])
    return out


def main():
    logdir = sys.argv[1]
    multiplexer = event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    scalars = {}
    for run, tags in multiplexer.Runs().items():
        scalars[run] = {
            tag: [[e.step, e.value] for e in multiplexer.Scalars(run, tag)]
            for tag in tags["scalars"]
        }
    sessions = {}
    for run, tags in multiplexer.PluginRunToTagToContent("hparams").items():
        session = sessions.setdefault(run, {})
        for tag, content in tags.items():
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            kind = data.WhichOneof("data")
            if kind == "session_start_info":
                session["start"] = json_format.MessageToDict(data.session_start_info)
            elif kind == "session_end_info":
                session["end"] = json_format.MessageToDict(data.session_end_info)
    json.dump({"raw": raw_events(logdir), "scalars": scalars, "sessions": sessions}, sys.stdout)


if __name__ == "__main__":
    main()
