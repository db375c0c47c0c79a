/** The status bar item: loading, ready, busy, error. Fed by the server's $/progress (model
 * loading) and by the requests in flight. */

import * as vscode from "vscode";
import {
  type BaseLanguageClient,
  type ClientCapabilities,
  type FeatureState,
  type StaticFeature,
  WorkDoneProgress,
  WorkDoneProgressCreateRequest,
  type WorkDoneProgressBegin,
  type WorkDoneProgressEnd,
  type WorkDoneProgressReport,
} from "vscode-languageclient/node";

import { trace } from "./trace";

export type State = "starting" | "loading" | "ready" | "busy" | "error";

const LOOK: Record<State, { text: string; tooltip: string }> = {
  starting: { text: "$(loading~spin) Diffusion", tooltip: "diffusion-lsp: starting the server" },
  loading: { text: "$(loading~spin) Diffusion: loading", tooltip: "diffusion-lsp: loading the model" },
  ready: { text: "$(sparkle) Diffusion", tooltip: "diffusion-lsp: ready" },
  busy: { text: "$(sync~spin) Diffusion", tooltip: "diffusion-lsp: filling" },
  error: { text: "$(error) Diffusion", tooltip: "diffusion-lsp: error (click for the log)" },
};

export class Status implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem("diffusionLsp.status", vscode.StatusBarAlignment.Right, 100);
  private base: Exclude<State, "busy"> = "starting"; // the state when nothing is in flight
  private inFlight = 0;
  private detail = "";

  constructor() {
    this.item.name = "diffusion-lsp";
    this.item.command = "diffusionLsp.showOutput";
    this.render();
    this.item.show();
  }

  set(state: Exclude<State, "busy">, detail = ""): void {
    this.base = state;
    this.detail = detail;
    this.render();
  }

  /** Show busy while `work` runs. */
  async track<T>(work: Thenable<T>): Promise<T> {
    this.inFlight += 1;
    this.render();
    try {
      return await work;
    } finally {
      this.inFlight -= 1;
      this.render();
    }
  }

  get state(): State {
    return this.inFlight > 0 && this.base === "ready" ? "busy" : this.base;
  }

  private shown: State | undefined;

  private render(): void {
    const state = this.state;
    const look = LOOK[state];
    this.item.text = look.text;
    this.item.tooltip = this.detail ? `${look.tooltip}: ${this.detail}` : look.tooltip;
    this.item.backgroundColor = state === "error" ? new vscode.ThemeColor("statusBarItem.errorBackground") : undefined;
    if (state !== this.shown) {
      this.shown = state;
      trace({ event: "status", state, detail: this.detail });
    }
  }

  dispose(): void {
    this.item.dispose();
  }
}

/** Takes over window/workDoneProgress/create (registered after the client's own feature, so
 * its handler wins): model loading shows in the status item and as a window progress. */
export class ProgressStatusFeature implements StaticFeature {
  private parts = new Set<vscode.Disposable>();

  constructor(
    private readonly client: BaseLanguageClient,
    private readonly status: Status,
  ) {}

  fillClientCapabilities(capabilities: ClientCapabilities): void {
    capabilities.window = { ...capabilities.window, workDoneProgress: true };
  }

  initialize(): void {
    this.client.onRequest(WorkDoneProgressCreateRequest.type, ({ token }) => {
      let finish: () => void = () => undefined;
      const done = new Promise<void>((resolve) => (finish = resolve));
      const listener = this.client.onProgress(
        WorkDoneProgress.type,
        token,
        (value: WorkDoneProgressBegin | WorkDoneProgressReport | WorkDoneProgressEnd) => {
          if (value.kind === "begin") {
            this.status.set("loading", value.title);
            void vscode.window.withProgress(
              { location: vscode.ProgressLocation.Window, title: value.title },
              () => done,
            );
          } else if (value.kind === "end") {
            const failed = value.message !== undefined && value.message !== "ready";
            this.status.set(failed ? "error" : "ready", value.message ?? "");
            finish();
            listener.dispose();
            this.parts.delete(listener);
          }
        },
      );
      this.parts.add(listener);
    });
  }

  getState(): FeatureState {
    return { kind: "static" };
  }

  clear(): void {
    for (const part of this.parts) {
      part.dispose();
    }
    this.parts.clear();
  }
}
