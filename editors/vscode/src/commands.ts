/** Editor commands that run the server's commands on the active editor: fill the hole at the
 * cursor, fill all holes, regenerate or refine the selection. The server applies the edit
 * itself (workspace/applyEdit); the command returns it too. */

import * as vscode from "vscode";
import { type BaseLanguageClient, ExecuteCommandRequest, type WorkspaceEdit } from "vscode-languageclient/node";

import type { Status } from "./status";
import { trace } from "./trace";

/** Editor command -> (server command, its arguments for an editor). */
const COMMANDS: Record<string, [string, (e: vscode.TextEditor) => unknown[]]> = {
  "diffusionLsp.fillHole": ["diffusion.fillHole", (e) => [uri(e), e.selection.active.line, e.selection.active.character]],
  "diffusionLsp.fillAllHoles": ["diffusion.fillAllHoles", (e) => [uri(e)]],
  "diffusionLsp.regenerateSelection": ["diffusion.regenerateSelection", selection],
  "diffusionLsp.refineSelection": ["diffusion.refineSelection", selection],
};

function uri(e: vscode.TextEditor): string {
  return e.document.uri.toString();
}

function selection(e: vscode.TextEditor): unknown[] {
  const s = e.selection;
  return [uri(e), s.start.line, s.start.character, s.end.line, s.end.character];
}

export function registerCommands(client: () => BaseLanguageClient | undefined, status: Status): vscode.Disposable[] {
  return Object.entries(COMMANDS).map(([name, [command, args]]) =>
    vscode.commands.registerCommand(name, async (): Promise<WorkspaceEdit | undefined> => {
      const editor = vscode.window.activeTextEditor;
      if (!editor) {
        return undefined;
      }
      const lsp = client();
      if (!lsp || !lsp.isRunning()) {
        void vscode.window.showWarningMessage("diffusion-lsp is not running");
        return undefined;
      }
      if (command.endsWith("Selection") && editor.selection.isEmpty) {
        void vscode.window.showInformationMessage("Select the code to rewrite first");
        return undefined;
      }
      const version = editor.document.version;
      const params = { command, arguments: args(editor) };
      try {
        const edit = (await status.track(lsp.sendRequest(ExecuteCommandRequest.type, params))) as WorkspaceEdit | null;
        trace({ event: "command", command, uri: uri(editor), version, outcome: edit ? "served" : "empty" });
        if (!edit) {
          vscode.window.setStatusBarMessage("Diffusion: nothing to fill", 3000);
        }
        return edit ?? undefined;
      } catch (err) {
        trace({ event: "command", command, uri: uri(editor), version, outcome: "failed", error: String(err) });
        void vscode.window.showErrorMessage(`diffusion-lsp: ${command} failed: ${String(err)}`);
        return undefined;
      }
    }),
  );
}
