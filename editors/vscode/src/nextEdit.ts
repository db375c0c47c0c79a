/** Next edit suggestions: diffusion/inlineEdit asks the server for the next edit (what the
 * user's last edit implies elsewhere, else a fix of the statement at the cursor); the best is
 * shown in place (the old text struck through, the new text after it)
 * until accepted (Tab), dismissed (Escape), or the document changes. */

import * as vscode from "vscode";
import type { BaseLanguageClient } from "vscode-languageclient/node";

import { Drafts } from "./drafts";
import type { Status } from "./status";
import { trace } from "./trace";

export const INLINE_EDIT = "diffusion/inlineEdit";
const VISIBLE = "diffusionLsp.nextEditVisible"; // context key for the accept and dismiss keys

interface WireRange {
  start: { line: number; character: number };
  end: { line: number; character: number };
}

export interface InlineEdit {
  range: WireRange;
  text: string;
  textDocument: { uri: string; version: number | null };
}

interface Pending {
  editor: vscode.TextEditor;
  version: number;
  range: vscode.Range;
  text: string;
}

export class NextEdit implements vscode.Disposable {
  private readonly removed = vscode.window.createTextEditorDecorationType({
    backgroundColor: new vscode.ThemeColor("diffEditor.removedTextBackground"),
    textDecoration: "line-through",
  });
  private readonly added = vscode.window.createTextEditorDecorationType({
    after: {
      backgroundColor: new vscode.ThemeColor("diffEditor.insertedTextBackground"),
      margin: "0 0 0 1em",
    },
  });
  private pending: Pending | undefined;
  private readonly disposables: vscode.Disposable[];

  constructor(
    private readonly client: BaseLanguageClient,
    private readonly status: Status,
  ) {
    this.disposables = [
      vscode.workspace.onDidChangeTextDocument((e) => {
        if (this.pending && e.document === this.pending.editor.document && e.contentChanges.length > 0) {
          this.dismiss();
        }
      }),
      vscode.window.onDidChangeActiveTextEditor(() => this.dismiss()),
    ];
  }

  /** Ask for an edit at the cursor and show it. */
  async suggest(editor: vscode.TextEditor): Promise<InlineEdit | undefined> {
    this.dismiss();
    const doc = editor.document;
    const version = doc.version;
    const params = {
      textDocument: { uri: doc.uri.toString(), version },
      position: editor.selection.active,
    };
    const answer = await this.status.track(this.client.sendRequest<{ edits: InlineEdit[] }>(INLINE_EDIT, params));
    const edit = answer?.edits?.[0];
    trace({ event: "nextEdit", uri: params.textDocument.uri, version, outcome: edit ? "served" : "empty", text: edit?.text });
    if (!edit || doc.version !== version || (edit.textDocument.version ?? version) !== version) {
      vscode.window.setStatusBarMessage(edit ? "Diffusion: the document changed; edit dropped" : "Diffusion: no edit to suggest", 3000);
      return undefined;
    }
    const range = new vscode.Range(
      edit.range.start.line,
      edit.range.start.character,
      edit.range.end.line,
      edit.range.end.character,
    );
    this.pending = { editor, version, range, text: edit.text };
    editor.setDecorations(this.removed, [range]);
    editor.setDecorations(this.added, [
      { range: new vscode.Range(range.end, range.end), renderOptions: { after: { contentText: Drafts.render(edit.text) } } },
    ]);
    await vscode.commands.executeCommand("setContext", VISIBLE, true);
    return edit;
  }

  /** Apply the shown edit, if the document is still the one it was made for. */
  async accept(): Promise<boolean> {
    const pending = this.pending;
    this.dismiss();
    if (!pending || pending.editor.document.version !== pending.version) {
      return false;
    }
    const ok = await pending.editor.edit((b) => b.replace(pending.range, pending.text));
    trace({ event: "nextEditAccepted", uri: pending.editor.document.uri.toString(), applied: ok });
    return ok;
  }

  dismiss(): void {
    if (!this.pending) {
      return;
    }
    this.pending.editor.setDecorations(this.removed, []);
    this.pending.editor.setDecorations(this.added, []);
    this.pending = undefined;
    void vscode.commands.executeCommand("setContext", VISIBLE, false);
  }

  dispose(): void {
    this.dismiss();
    this.removed.dispose();
    this.added.dispose();
    for (const d of this.disposables) {
      d.dispose();
    }
  }
}
