/** Drafts: the server's intermediate canvases (diffusion/draft, sent while a fill denoises when
 * `diffusionLsp.drafts` is on), shown as faded text at the insertion point until the final
 * answer arrives, the document changes, or the request ends. */

import * as vscode from "vscode";
import type { BaseLanguageClient } from "vscode-languageclient/node";

import { trace } from "./trace";

export const DRAFT = "diffusion/draft";

export interface DraftParams {
  requestId: number | string;
  textDocument: { uri: string; version: number };
  position: { line: number; character: number };
  text: string;
  step: number;
  done: boolean;
}

const MAX_SHOWN = 120; // characters of a draft drawn after the cursor (decorations are one line)

export class Drafts implements vscode.Disposable {
  private readonly look = vscode.window.createTextEditorDecorationType({
    after: { color: new vscode.ThemeColor("editorGhostText.foreground"), fontStyle: "italic" },
  });
  private readonly shown = new Set<string>(); // uris with a draft drawn
  private readonly disposables: vscode.Disposable[] = [];

  constructor(client: BaseLanguageClient) {
    this.disposables.push(
      client.onNotification(DRAFT, (params: DraftParams) => this.show(params)),
      vscode.workspace.onDidChangeTextDocument((e) => this.clear(e.document.uri.toString())),
    );
  }

  /** One line of text for a draft: newlines as ⏎, long drafts cut. */
  static render(text: string): string {
    const line = text.replace(/\r?\n/g, " ⏎ ");
    return line.length > MAX_SHOWN ? line.slice(0, MAX_SHOWN) + "…" : line;
  }

  private show(params: DraftParams): void {
    const uri = params.textDocument.uri;
    trace({ event: "draft", uri, version: params.textDocument.version, step: params.step, text: params.text });
    const editors = vscode.window.visibleTextEditors.filter(
      (e) => e.document.uri.toString() === uri && e.document.version === params.textDocument.version,
    );
    if (params.done || editors.length === 0) {
      this.clear(uri);
      return;
    }
    const at = new vscode.Position(params.position.line, params.position.character);
    const options: vscode.DecorationOptions[] = [
      { range: new vscode.Range(at, at), renderOptions: { after: { contentText: Drafts.render(params.text) } } },
    ];
    for (const editor of editors) {
      editor.setDecorations(this.look, options);
    }
    this.shown.add(uri);
  }

  /** Remove the draft of a document (its fill answered, or the text moved on). */
  clear(uri: string): void {
    if (!this.shown.delete(uri)) {
      return;
    }
    for (const editor of vscode.window.visibleTextEditors) {
      if (editor.document.uri.toString() === uri) {
        editor.setDecorations(this.look, []);
      }
    }
  }

  dispose(): void {
    this.look.dispose();
    for (const d of this.disposables) {
      d.dispose();
    }
  }
}
