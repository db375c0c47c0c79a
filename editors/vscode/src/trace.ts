/** Request events as JSON lines in `diffusionLsp.trace.file`: what was asked, for which document
 * version, and what came of it (served, empty, cancelled, failed). For diagnosis and tests. */

import { appendFileSync } from "node:fs";

import { traceFile } from "./config";

export type TraceEvent = Record<string, unknown> & { event: string };

let seq = 0;

/** Append one event; tracing never breaks a request, so write errors are ignored. */
export function trace(event: TraceEvent): void {
  const file = traceFile();
  if (!file) {
    return;
  }
  seq += 1;
  try {
    appendFileSync(file, JSON.stringify({ seq, time: Date.now(), ...event }) + "\n");
  } catch {
    // a trace file that cannot be written is not the user's problem
  }
}
