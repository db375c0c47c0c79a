/** Settings: the server command line and the options the server reads (section `diffusionLsp`). */

import * as vscode from "vscode";
import type { ServerOptions } from "vscode-languageclient/node";

export const SECTION = "diffusionLsp";

// settings:begin: generated from lsp_server/settings.py by lsp_server/gen_settings.py
/** The settings the server understands, under their names in package.json and on the wire. */
const SERVER_KEYS = [
  "model",
  "backend",
  "device",
  "quantization",
  "strategy",
  "maxSteps",
  "maxFillTokens",
  "contextTokens",
  "debounceMs",
  "deadlineMs",
  "alternatives",
  "minConfidence",
  "editMargin",
  "languages",
  "drafts",
  "oneLineWhileTyping",
  "endWhereUnsure",
  "middlePriming",
  "repositoryContext",
  "encodeWhenIdle",
  "fillAhead",
  "endpoint",
  "dialect",
  "remoteModel",
  "endpointPath",
  "apiKeyEnv",
  "logprobs",
  "requestTimeoutMs",
  "tlsVerify",
] as const;
// settings:end

/** The server's settings as initializationOptions: `{diffusionLsp: {...}}`, unset values left out
 * (the server then uses its defaults). */
export function serverSettings(config = vscode.workspace.getConfiguration(SECTION)): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const key of SERVER_KEYS) {
    const value = config.get<unknown>(key);
    if (value !== null && value !== undefined && value !== "") {
      out[key] = value;
    }
  }
  return { [SECTION]: out };
}

/** `diffusionLsp.server.command` when set, else `<python> -m lsp_server`; stdio either way. */
export function serverOptions(config = vscode.workspace.getConfiguration(SECTION)): ServerOptions {
  const command = config.get<string[]>("server.command") ?? [];
  if (command.length > 0) {
    return { command: command[0], args: command.slice(1) };
  }
  const python = config.get<string>("server.python") || "python3";
  return { command: python, args: ["-m", "lsp_server"] };
}

/** Where request events go (one JSON line each), or undefined when tracing is off. */
export function traceFile(config = vscode.workspace.getConfiguration(SECTION)): string | undefined {
  return config.get<string>("trace.file") || undefined;
}
