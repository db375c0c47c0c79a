;;; diffusion-lsp.el --- Diffusion-model code infill through eglot  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The diffusion-lsp authors
;; SPDX-License-Identifier: Apache-2.0

;; Author: The diffusion-lsp authors
;; Maintainer: The diffusion-lsp authors

;; Version: 0.1.0
;; Package-Requires: ((emacs "28.1") (eglot "1.9") (jsonrpc "1.0.14"))
;; Keywords: languages, tools, convenience

;;; Commentary:

;; The Emacs client of diffusion-lsp, a language server that fills code
;; from a diffusion language model looking at the code on both sides of
;; the cursor.  Everything goes through eglot:
;;
;; - `diffusion-lsp-eglot-mode', a global minor mode: an
;;   `eglot-server-programs' entry that starts `diffusion-lsp' (see
;;   `diffusion-lsp-server-command') for the modes in
;;   `diffusion-lsp-major-modes', with its settings sent as
;;   initializationOptions (the `diffusionLsp' object) from the
;;   customization group `diffusion-lsp'.  Loading this file changes
;;   nothing until the mode is on;
;; - completion-at-point: eglot's own (its exit function mended for
;;   eglot 1.9); the fill is the item marked ✦;
;; - `diffusion-lsp-fill-holes', `diffusion-lsp-fill-hole',
;;   `diffusion-lsp-regenerate-region', `diffusion-lsp-refine-region':
;;   the server's code actions, run as workspace/executeCommand (the
;;   server applies the edit through workspace/applyEdit);
;; - `diffusion-lsp-next-edit': the custom request diffusion/inlineEdit,
;;   the suggested edit shown in the buffer and applied on confirmation;
;; - `diffusion-lsp-inline-mode': ghost text.  eglot has no
;;   textDocument/inlineCompletion, so this mode sends it itself on
;;   eglot's connection, shows the first item as an overlay after point,
;;   accepts it with TAB and dismisses it on the next command or edit.
;;
;; Usage: load this file, M-x diffusion-lsp-eglot-mode (or
;; `(diffusion-lsp-eglot-mode 1)' in your init), open a Python file,
;; M-x eglot.  See editors/emacs/README.md.

;;; Code:

(require 'cl-lib)
(require 'diff-mode)                    ; faces for the next-edit preview
(require 'eglot)
(require 'jsonrpc)
(require 'seq)
(require 'subr-x)

(defgroup diffusion-lsp nil
  "Code infill from a diffusion language model, through eglot."
  :group 'eglot
  :prefix "diffusion-lsp-")

;;;; Server and settings

(defvar diffusion-lsp-eglot-mode)      ; defined at the end

(defun diffusion-lsp--set-and-register (symbol value)
  "Set SYMBOL to VALUE and refresh the `eglot-server-programs' entry, if any."
  (set-default symbol value)
  (when (and (bound-and-true-p diffusion-lsp-eglot-mode) (fboundp 'diffusion-lsp--register))
    (diffusion-lsp--register)))

(defcustom diffusion-lsp-server-command '("diffusion-lsp")
  "The command that starts the language server: program and arguments.
For example (\"/path/to/venv/bin/diffusion-lsp\" \"--log-file\"
\"/tmp/diffusion-lsp.log\"), or (\"python3\" \"-m\" \"lsp_server\")."
  :type '(repeat string))

(defcustom diffusion-lsp-major-modes
  '(python-mode python-ts-mode
    (js-mode :language-id "javascript") (js-ts-mode :language-id "javascript")
    typescript-mode typescript-ts-mode (tsx-ts-mode :language-id "typescriptreact")
    go-mode go-ts-mode rust-mode rust-ts-mode java-mode java-ts-mode
    c-mode c-ts-mode (c++-mode :language-id "cpp") (c++-ts-mode :language-id "cpp")
    ruby-mode ruby-ts-mode lua-mode)
  "Major modes whose buffers eglot connects to diffusion-lsp.
Each element is a mode symbol or (MODE :language-id ID), as in
`eglot-server-programs'.  eglot runs one server per buffer: a mode
listed here is served by diffusion-lsp instead of its usual server."
  :type '(repeat (choice symbol (list symbol (const :language-id) string)))
  :initialize #'custom-initialize-default
  :set #'diffusion-lsp--set-and-register)

;; settings:begin: generated from lsp_server/settings.py by lsp_server/gen_settings.py
(defcustom diffusion-lsp-model nil
  "Model directory, holding one of these checkpoints (the backend that
runs it): embedded-architecture (onnx, torch); exported Qwen2, Llama
or Dream (onnx); DiffusionGemma (diffusion_gemma); Dream, Qwen2 or
Llama (dream); LLaDA (llada); Fast-dLLM v2 or SDAR (block_causal).
A directory; nil: the shipped model."
  :type '(choice (const :tag "The shipped model" nil) directory))

(defcustom diffusion-lsp-backend nil
  "Inference backend.
One of \"auto\", \"onnx\", \"torch\", \"diffusion_gemma\", \"dream\", \"llada\",
\"block_causal\"; nil: the server's default (\"auto\")."
  :type '(choice (const :tag "Server default" nil)
                 (const "auto") (const "onnx") (const "torch")
                 (const "diffusion_gemma") (const "dream") (const "llada")
                 (const "block_causal")))

(defcustom diffusion-lsp-device nil
  "Device: `cpu', `cuda' or `cuda:N'.
A string; nil: the server's default (\"cpu\")."
  :type '(choice (const :tag "Server default" nil) string))

(defcustom diffusion-lsp-quantization nil
  "Weights in `int8' or `4bit' (a mixture's experts included), for a GPU
that cannot hold the checkpoint in bfloat16.  For these checkpoints:
DiffusionGemma; Dream, Qwen2 or Llama; LLaDA; Fast-dLLM v2 or SDAR.
The memory needed is checked before loading (docs/gpu.md).
One of \"none\", \"int8\", \"4bit\"; nil: the server's default (\"none\")."
  :type '(choice (const :tag "Server default" nil)
                 (const "none") (const "int8") (const "4bit")))

(defcustom diffusion-lsp-strategy nil
  "Decoding strategy.
`left_to_right' decodes one canvas token per step, `autoregressive'
one token at a time through the context encoder (for models trained
for it: config.json `\"autoregressive\": true'), `verified' drafts on
the canvas and keeps what the one-token mode of the same weights
agrees with (its greedy fill, in fewer passes when the drafts are
good).
One of \"entropy_bound\", \"confidence\", \"fixed_k\", \"low_confidence\",
\"left_to_right\", \"autoregressive\", \"verified\"; nil: the model's
default."
  :type '(choice (const :tag "The model's default" nil)
                 (const "entropy_bound") (const "confidence")
                 (const "fixed_k") (const "low_confidence")
                 (const "left_to_right") (const "autoregressive")
                 (const "verified")))

(defcustom diffusion-lsp-max-steps nil
  "Most denoising steps per fill.
An integer in 1..1024; nil: the model's default."
  :type '(choice (const :tag "The model's default" nil) integer))

(defcustom diffusion-lsp-max-fill-tokens nil
  "Cap on a fill's canvas (tokens).
Its length comes from the syntax span: 32 for a line, 64 for prose,
128 for a body or a hole, enough for the text a rewrite replaces.
An integer in 1..256; nil: no cap."
  :type '(choice (const :tag "No cap" nil) integer))

(defcustom diffusion-lsp-context-tokens nil
  "Context tokens around the cursor given to the model (a remote engine
gets about 4 characters a token).
An integer in 16..1048576; nil: the model's default."
  :type '(choice (const :tag "The model's default" nil) integer))

(defcustom diffusion-lsp-debounce-ms nil
  "Server-side wait (ms) before an automatic fill starts.
A newer request in that time replaces it.
An integer in 0..5000; nil: the server's default (0)."
  :type '(choice (const :tag "Server default" nil) integer))

(defcustom diffusion-lsp-deadline-ms nil
  "A completion stops denoising this long (ms) after it starts.
It answers with what it has then; code-action commands run to their
end.
An integer in 50..60000; nil: the server's default (2000)."
  :type '(choice (const :tag "Server default" nil) integer))

(defcustom diffusion-lsp-alternatives nil
  "Candidates asked for when you trigger a suggestion explicitly.
An integer in 1..8; nil: the server's default (3)."
  :type '(choice (const :tag "Server default" nil) integer))

(defcustom diffusion-lsp-min-confidence nil
  "Ghost text that comes while you type is shown only as far as the
model's confidence reaches this: it ends before its first token below
it (`endWhereUnsure'; off: a fill below it is held back whole).
`auto': the model's calibrated threshold (docs/confidence.md); `0'
shows every fill.  A suggestion you ask for is always shown whole.
The string \"auto\" or a number in 0..1; nil: the server's default
\(\"auto\")."
  :type '(choice (const :tag "Server default" nil) (const "auto") number))

(defcustom diffusion-lsp-edit-margin nil
  "How much more likely (in nats, natural-log units) the model must find
the code with an in-line edit than without it before the edit is
suggested (next edit, Refine selection).  Higher: fewer, surer edits.
`auto': 3 for a fix the model finds itself, 1 for a change your last
edit implies elsewhere (docs/server.md, Next edit).  A negative number
also shows edits the model does not prefer.
The string \"auto\" or a number in -100..100; nil: the server's default
\(\"auto\")."
  :type '(choice (const :tag "Server default" nil) (const "auto") number))

(defcustom diffusion-lsp-languages nil
  "Language ids the server fills; empty: all."
  :type '(repeat string))

(defcustom diffusion-lsp-drafts nil
  "Show the fill as it forms.
The server sends its intermediate denoising steps as `diffusion/draft'
notifications, which the client shows as faded text at the cursor."
  :type 'boolean)

(defcustom diffusion-lsp-one-line-while-typing t
  "Ghost text that comes while you type is one line: it comes sooner, and
is more often right to its end.  The next line is made while it is on
screen (`fillAhead') and shown after Tab.  Off: as many lines as the
place allows.  A suggestion you ask for is never cut."
  :type 'boolean)

(defcustom diffusion-lsp-end-where-unsure t
  "Ghost text that comes while you type ends before its first token whose
probability is below `minConfidence', instead of being held back
whole: what you see is what the model is sure of."
  :type 'boolean)

(defcustom diffusion-lsp-middle-priming t
  "Give the model the text typed on the cursor's line as the start of its
fill, and let it spell the last, partial word its own way, so that a
keystroke on the line re-reads only what was typed, not the code after
the cursor: the ghost text comes several times sooner.  For models that
fill in the prefix-suffix-middle order one token at a time
\(Qwen2.5-Coder); off: the exact order, every keystroke."
  :type 'boolean)

(defcustom diffusion-lsp-repository-context t
  "Give each fill pieces of your other files: the other open documents
and the files the current one imports inside the workspace folders
\(never outside them, nothing ignored by `.gitignore', binary or over
200 KB), the pieces most like the code around the cursor.  For models
with a format for it (Qwen2.5-Coder's repository layout) and remote
engines that take it.  Off: the current file alone."
  :type 'boolean)

(defcustom diffusion-lsp-encode-when-idle t
  "When you pause (2 seconds without typing), choose the repository
context again for the cursor's place and encode it for the model then,
in the idle time, so that no keystroke's suggestion waits for it
\(llama.vim does the same with its ring of chunks); the context changes
once it is encoded, and typing stops the encoding at once.  Off: the
next keystroke's fill encodes it.  For local models that take
repository context, and for llama.cpp's server (dialect
`llama-infill'), which is sent the pieces ahead in a request that
writes nothing, for its prompt cache."
  :type 'boolean)

(defcustom diffusion-lsp-fill-ahead t
  "While a suggestion is on screen, make the next one in the idle time,
as if it had been accepted, so that the suggestion after a Tab is
there at once."
  :type 'boolean)

(defcustom diffusion-lsp-endpoint nil
  "URL of an inference server that the fills come from.
A vLLM server, a hosted FIM API or llama-server, over `http://' or
`https://'; a base path is kept (`https://host/api').  See
docs/remote.md.
A string; nil: the local model."
  :type '(choice (const :tag "The local model" nil) string))

(defcustom diffusion-lsp-dialect nil
  "What the endpoint speaks.
`vllm': a rendered prompt over /v1/completions; `openai-fim': prompt
and suffix; `llama-infill': llama-server's /infill; `chat': an
OpenAI-compatible /v1/chat/completions (hosted endpoints that serve
only chat), the fill asked for with a hole marker.
One of \"vllm\", \"openai-fim\", \"llama-infill\", \"chat\"; nil: the server's
default (\"vllm\")."
  :type '(choice (const :tag "Server default" nil)
                 (const "vllm") (const "openai-fim") (const "llama-infill")
                 (const "chat")))

(defcustom diffusion-lsp-remote-model nil
  "The served model's name, sent as `model' with each request.
A string; nil: no name sent."
  :type '(choice (const :tag "No name sent" nil) string))

(defcustom diffusion-lsp-endpoint-path nil
  "Request path on the endpoint, e.g. `/v1/fim/completions'.
A string; nil: the dialect's (/v1/completions, /infill,
/v1/chat/completions)."
  :type '(choice (const :tag "The dialect's (/v1/completions, /infill, /v1/chat/completions)" nil)
                 string))

(defcustom diffusion-lsp-api-key-env nil
  "Name of the environment variable that holds the API key.
It is sent as `Authorization: Bearer'; the key itself never goes in a
settings file or a log.
A string; nil: no key."
  :type '(choice (const :tag "No key" nil) string))

(defcustom diffusion-lsp-logprobs nil
  "Ask the endpoint for the tokens' log-probabilities, which give a
remote fill its confidence (minConfidence then holds back unsure ghost
text, docs/confidence.md).  `auto': asked for until the endpoint
refuses the field (then asked again without it, and never again);
`on': a refusal is an error; `chat' never asks.
One of \"auto\", \"on\", \"off\"; nil: the server's default (\"auto\")."
  :type '(choice (const :tag "Server default" nil)
                 (const "auto") (const "on") (const "off")))

(defcustom diffusion-lsp-request-timeout-ms nil
  "Wait (ms) for the endpoint to connect and for each piece of its reply.
An integer in 100..600000; nil: the server's default (10000)."
  :type '(choice (const :tag "Server default" nil) integer))

(defcustom diffusion-lsp-tls-verify t
  "Verify the endpoint's TLS certificate."
  :type 'boolean)

(defun diffusion-lsp-settings ()
  "The `diffusionLsp' settings object (a plist) sent to the server.
Settings left at nil are omitted, so the server's defaults apply; the
booleans are always sent."
  (let ((pairs `((:model . ,(and diffusion-lsp-model (expand-file-name diffusion-lsp-model)))
                 (:backend . ,diffusion-lsp-backend)
                 (:device . ,diffusion-lsp-device)
                 (:quantization . ,diffusion-lsp-quantization)
                 (:strategy . ,diffusion-lsp-strategy)
                 (:maxSteps . ,diffusion-lsp-max-steps)
                 (:maxFillTokens . ,diffusion-lsp-max-fill-tokens)
                 (:contextTokens . ,diffusion-lsp-context-tokens)
                 (:debounceMs . ,diffusion-lsp-debounce-ms)
                 (:deadlineMs . ,diffusion-lsp-deadline-ms)
                 (:alternatives . ,diffusion-lsp-alternatives)
                 (:minConfidence . ,diffusion-lsp-min-confidence)
                 (:editMargin . ,diffusion-lsp-edit-margin)
                 (:languages . ,(and diffusion-lsp-languages (vconcat diffusion-lsp-languages)))
                 (:drafts . ,(if diffusion-lsp-drafts t :json-false))
                 (:oneLineWhileTyping . ,(if diffusion-lsp-one-line-while-typing t :json-false))
                 (:endWhereUnsure . ,(if diffusion-lsp-end-where-unsure t :json-false))
                 (:middlePriming . ,(if diffusion-lsp-middle-priming t :json-false))
                 (:repositoryContext . ,(if diffusion-lsp-repository-context t :json-false))
                 (:encodeWhenIdle . ,(if diffusion-lsp-encode-when-idle t :json-false))
                 (:fillAhead . ,(if diffusion-lsp-fill-ahead t :json-false))
                 (:endpoint . ,diffusion-lsp-endpoint)
                 (:dialect . ,diffusion-lsp-dialect)
                 (:remoteModel . ,diffusion-lsp-remote-model)
                 (:endpointPath . ,diffusion-lsp-endpoint-path)
                 (:apiKeyEnv . ,diffusion-lsp-api-key-env)
                 (:logprobs . ,diffusion-lsp-logprobs)
                 (:requestTimeoutMs . ,diffusion-lsp-request-timeout-ms)
                 (:tlsVerify . ,(if diffusion-lsp-tls-verify t :json-false)))))
    (cl-loop for (key . value) in pairs when value append (list key value))))
;; settings:end

(defcustom diffusion-lsp-request-timeout 60
  "Seconds to wait for a fill, a code action command or a next edit.
The first request waits for the model to load."
  :type 'number)

(defcustom diffusion-lsp-confirm-edits nil
  "Non-nil to confirm the edits of the fill and rewrite commands.
Bound as `eglot-confirm-server-initiated-edits' while they run: you
asked for the edit, so by default it is applied without a prompt."
  :type 'boolean)

(defclass diffusion-lsp-server (eglot-lsp-server) ()
  :documentation "An eglot connection to diffusion-lsp.")

(defun diffusion-lsp--contact (_interactive)
  "The eglot contact for diffusion-lsp, read from the current settings."
  (cons 'diffusion-lsp-server diffusion-lsp-server-command))

(cl-defmethod eglot-initialization-options ((_server diffusion-lsp-server))
  "Send the `diffusion-lsp' customization group as initializationOptions."
  (list :diffusionLsp (diffusion-lsp-settings)))

(defun diffusion-lsp--register ()
  "Put the diffusion-lsp entry first in `eglot-server-programs'."
  (setq eglot-server-programs
        (cons (cons diffusion-lsp-major-modes #'diffusion-lsp--contact)
              (cl-remove #'diffusion-lsp--contact eglot-server-programs :key #'cdr))))

(defun diffusion-lsp--server ()
  "The diffusion-lsp connection of the current buffer, or a `user-error'."
  (let ((server (eglot-current-server)))
    (unless (cl-typep server 'diffusion-lsp-server)
      (user-error "diffusion-lsp: this buffer is not managed by diffusion-lsp (M-x eglot)"))
    server))

;;;; Code actions: fill holes, regenerate, refine

(defun diffusion-lsp--run-action (command beg end)
  "Run the code action whose command is COMMAND for BEG..END; return its result.
The server applies the edit through workspace/applyEdit."
  (let* ((server (diffusion-lsp--server))
         (actions (eglot-code-actions beg end "refactor.rewrite"))
         (action (cl-find command actions :test #'equal
                          :key (lambda (a) (plist-get (plist-get a :command) :command)))))
    (unless action
      (user-error "diffusion-lsp: no `%s' here" command))
    (let ((cmd (plist-get action :command))
          (eglot-confirm-server-initiated-edits (and diffusion-lsp-confirm-edits 'confirm)))
      (message "diffusion-lsp: %s..." (plist-get action :title))
      (let ((edit (jsonrpc-request server :workspace/executeCommand
                                   (list :command (plist-get cmd :command)
                                         :arguments (plist-get cmd :arguments))
                                   :timeout diffusion-lsp-request-timeout)))
        (message (if edit "diffusion-lsp: %s: done"
                   "diffusion-lsp: %s: nothing applied (no fill that parses, or the buffer changed)")
                 (plist-get action :title))
        edit))))

(defun diffusion-lsp--region ()
  "The active region as (BEG END), or a `user-error'."
  (unless (use-region-p)
    (user-error "diffusion-lsp: select a region first"))
  (list (region-beginning) (region-end)))

;;;###autoload
(defun diffusion-lsp-fill-holes ()
  "Fill every hole in the buffer: `pass', `...', TODO markers, empty bodies."
  (interactive)
  (diffusion-lsp--run-action "diffusion.fillAllHoles" (point) (point)))

;;;###autoload
(defun diffusion-lsp-fill-hole ()
  "Fill the hole on the current line."
  (interactive)
  (diffusion-lsp--run-action "diffusion.fillHole" (point) (point)))

;;;###autoload
(defun diffusion-lsp-regenerate-region (beg end)
  "Regenerate the code between BEG and END (grown to whole syntax nodes)."
  (interactive (diffusion-lsp--region))
  (diffusion-lsp--run-action "diffusion.regenerateSelection" beg end))

;;;###autoload
(defun diffusion-lsp-refine-region (beg end)
  "Refine the code between BEG and END.
Apply the few fixes the model finds the code needs, each replacing only
what it fixes."
  (interactive (diffusion-lsp--region))
  (diffusion-lsp--run-action "diffusion.refineSelection" beg end))

;;;; Next edit suggestion (diffusion/inlineEdit)

(defface diffusion-lsp-edit-removed '((t :inherit diff-removed :strike-through t))
  "The text a suggested edit replaces.")

(defface diffusion-lsp-edit-added '((t :inherit diff-added))
  "The text a suggested edit inserts.")

(defun diffusion-lsp--request-next-edit ()
  "Ask the server for a next edit at point.
Return a plist (:range :text :textDocument), or nil."
  (let ((server (diffusion-lsp--server)))
    (eglot--signal-textDocument/didChange)
    (let ((answer (jsonrpc-request server :diffusion/inlineEdit
                                   (list :textDocument (eglot--VersionedTextDocumentIdentifier)
                                         :position (eglot--pos-to-lsp-position))
                                   :timeout diffusion-lsp-request-timeout)))
      (let ((edits (plist-get answer :edits)))  ; a vector, empty when there is no edit
        (unless (seq-empty-p edits) (seq-first edits))))))

;;;###autoload
(defun diffusion-lsp-next-edit (&optional no-confirm)
  "Show the server's next edit suggestion around point; apply it if confirmed.
With NO-CONFIRM (a prefix argument), apply it without asking."
  (interactive "P")
  (let ((edit (diffusion-lsp--request-next-edit)))
    (if (null edit)
        (message "diffusion-lsp: no edit to suggest here")
      (let* ((range (plist-get edit :range))
             (text (plist-get edit :text))
             (version (plist-get (plist-get edit :textDocument) :version))
             (region (eglot--range-region range))
             (preview (make-overlay (car region) (cdr region))))
        (overlay-put preview 'face 'diffusion-lsp-edit-removed)
        (overlay-put preview 'after-string (propertize text 'face 'diffusion-lsp-edit-added))
        (unwind-protect
            (if (or no-confirm (y-or-n-p "diffusion-lsp: apply this edit? "))
                (progn
                  (eglot--apply-text-edits (vector (list :range range :newText text)) version)
                  (message "diffusion-lsp: edit applied")
                  t)
              (message "diffusion-lsp: edit dismissed")
              nil)
          (delete-overlay preview))))))

;;;; completion-at-point: eglot 1.9's exit function

;; The fill's completion item replaces the identifier before point with
;; that identifier followed by the fill (a textEdit; its label is "✦ ..."
;; and its filterText the new text).  To apply a textEdit, eglot 1.9's
;; exit function first undoes what `completion-at-point' inserted, the
;; item's label, by deleting (length label) - (length symbol) characters
;; before point: right only when the label starts with the symbol.  For
;; a label shorter than the symbol ("✦ e" after "area") that deletes
;; characters after point (the line break after the cursor); for any
;; other label it leaves part of the label in the buffer.  So in
;; diffusion-lsp buffers the exit function is wrapped: it puts the
;; symbol back as it was when the items were asked for, and hands
;; eglot's exit function a proxy as long as the symbol (carrying the
;; item), so that eglot deletes nothing more and applies the textEdit
;; to the text the server computed it for.

(defun diffusion-lsp--completion-item (proxy table)
  "The LSP item of completion PROXY, a string offered by eglot's TABLE."
  (or (get-text-property 0 'eglot--lsp-item proxy)
      ;; chosen from *Completions*, PROXY has lost its properties
      (get-text-property 0 'eglot--lsp-item
                         (cl-find proxy (all-completions "" table) :test #'string=))))

(defun diffusion-lsp--completion-at-point (capf)
  "CAPF, the answer of `eglot-completion-at-point', with an exit function
that undoes the inserted label right (see the comment above)."
  (pcase capf
    ((and `(,start ,end ,table . ,props)
          (guard (and (< start end)       ; nil to undo before point: eglot is right
                      (plist-get props :exit-function)
                      (cl-typep (eglot-current-server) 'diffusion-lsp-server))))
     (let ((exit (plist-get props :exit-function))
           (others (copy-sequence props))
           (buffer (current-buffer))
           (typed (buffer-substring-no-properties start end)))
       (cl-remf others :exit-function)
       `(,start ,end ,table
                :exit-function
                ,(lambda (proxy status)
                   (with-current-buffer buffer
                     (let ((item (and (memq status '(finished exact))
                                      (<= start (point))
                                      (equal (buffer-substring-no-properties start (point)) proxy)
                                      (diffusion-lsp--completion-item proxy table))))
                       (if (not (plist-get item :textEdit))
                           (funcall exit proxy status)
                         (delete-region start (point))
                         (goto-char start)
                         (insert typed)
                         (funcall exit (propertize typed 'eglot--lsp-item item) status)))))
                ,@others)))
    (_ capf)))

;;;; Inline completion: ghost text

(defvar diffusion-lsp-inline-mode)      ; defined below

(defface diffusion-lsp-ghost '((t :inherit shadow))
  "The inline completion shown after point.")

(defface diffusion-lsp-draft '((t :inherit shadow :slant italic))
  "A draft of the inline completion, shown while it forms.")

(defcustom diffusion-lsp-inline-idle-delay 0.3
  "Idle seconds after an edit before `diffusion-lsp-inline-mode' asks for a fill.
nil: ask only when `diffusion-lsp-inline-complete' is called."
  :type '(choice (const :tag "Only on request" nil) number))

(defvar-local diffusion-lsp--ghost nil
  "The overlay showing the inline completion, or nil.
Its properties: `diffusion-lsp-text' (what TAB inserts) and
`diffusion-lsp-end' (a marker: the end of the text it replaces).")

(defvar-local diffusion-lsp--ghost-active nil
  "Non-nil while ghost text is shown: turns on `diffusion-lsp-inline-active-map'.")

(defvar-local diffusion-lsp--generation 0
  "Number of the newest inline completion request; older answers are dropped.")

(defvar-local diffusion-lsp--stale-answers 0
  "How many inline completion answers came for a request already superseded.")

(defvar-local diffusion-lsp--pending nil
  "The JSON-RPC id of the pending inline completion request, or t when it is not
known; nil when none is pending.  Drafts are shown only for it.")

(defvar-local diffusion-lsp--draft nil
  "The overlay showing the newest draft of the pending fill, or nil.")

(defvar-local diffusion-lsp--idle-timer nil)
(defvar-local diffusion-lsp--last-tick nil)

(defvar diffusion-lsp-inline-active-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "TAB") #'diffusion-lsp-inline-accept)
    (define-key map [tab] #'diffusion-lsp-inline-accept)
    (define-key map (kbd "M-<right>") #'diffusion-lsp-inline-accept-word)
    (define-key map (kbd "C-M-<right>") #'diffusion-lsp-inline-accept-line)
    map)
  "Keys active while ghost text is shown.")

(defvar diffusion-lsp--emulation-alist
  `((diffusion-lsp--ghost-active . ,diffusion-lsp-inline-active-map))
  "Puts `diffusion-lsp-inline-active-map' above other minor modes' TAB.")

(defvar diffusion-lsp-inline-keep-commands
  '(diffusion-lsp-inline-accept diffusion-lsp-inline-accept-word diffusion-lsp-inline-accept-line)
  "Commands that do not dismiss the ghost text.")

(defun diffusion-lsp--clear-draft ()
  "Remove the draft overlay, if any."
  (when diffusion-lsp--draft
    (delete-overlay diffusion-lsp--draft)
    (setq diffusion-lsp--draft nil)))

(defun diffusion-lsp--show-draft (id text)
  "Show TEXT, a draft of request ID, after point while that request is pending."
  (when (and diffusion-lsp--pending
             (or (eq diffusion-lsp--pending t) (not id) (equal id diffusion-lsp--pending))
             (stringp text) (not (string-empty-p text)))
    (let ((display (copy-sequence text)))
      (put-text-property 0 (length display) 'face 'diffusion-lsp-draft display)
      (put-text-property 0 1 'cursor t display)
      (unless (and diffusion-lsp--draft (overlay-buffer diffusion-lsp--draft))
        (setq diffusion-lsp--draft (make-overlay (point) (point) nil nil t)))
      (move-overlay diffusion-lsp--draft (point) (point))
      (overlay-put diffusion-lsp--draft 'after-string display))))

(cl-defmethod eglot-handle-notification
  ((_server diffusion-lsp-server) (_method (eql diffusion/draft)) &key requestId textDocument text &allow-other-keys)
  "Show a draft of the pending inline completion in the buffer it is for."
  (when-let* ((uri (plist-get textDocument :uri))
              (path (ignore-errors (eglot--uri-to-path uri)))
              (buffer (find-buffer-visiting path)))
    (with-current-buffer buffer
      (diffusion-lsp--show-draft requestId text))))

(defun diffusion-lsp-inline-dismiss ()
  "Remove the ghost text and any draft."
  (interactive)
  (diffusion-lsp--clear-draft)
  (when diffusion-lsp--ghost
    (set-marker (overlay-get diffusion-lsp--ghost 'diffusion-lsp-end) nil)
    (delete-overlay diffusion-lsp--ghost))
  (setq diffusion-lsp--ghost nil
        diffusion-lsp--ghost-active nil))

(defun diffusion-lsp-inline-accept ()
  "Insert the ghost text at point.  Without ghost text, indent as TAB would."
  (interactive)
  (if (not (and diffusion-lsp--ghost (overlay-buffer diffusion-lsp--ghost)))
      (indent-for-tab-command)
    (let* ((ghost diffusion-lsp--ghost)
           (beg (overlay-start ghost))
           (end (marker-position (overlay-get ghost 'diffusion-lsp-end)))
           (text (overlay-get ghost 'diffusion-lsp-text)))
      (diffusion-lsp-inline-dismiss)
      (goto-char beg)
      (delete-region beg end)
      (insert text))))

(defun diffusion-lsp--next-piece (rest unit)
  "The start of REST, the ghost text still to insert, that accepting UNIT takes.
UNIT `word': white space, then a run of word characters (or of other
non-blank characters); `line': the rest of the line, or, when REST
starts a new line, that line break and the line after it.  As VS Code's
acceptNextWord and acceptNextLine."
  (let ((pattern (if (eq unit 'line)
                     "\\`\n?[^\n]*"
                   "\\`[[:space:]]*\\(?:[[:alnum:]_]+\\|[^[:alnum:]_[:space:]]+\\)")))
    (if (string-match pattern rest) (match-string 0 rest) rest)))

(defun diffusion-lsp--accept-part (unit)
  "Insert the next UNIT (`word' or `line') of the ghost text at point.
The rest is shown again after point, as what TAB inserts (the edit
itself dismissed the ghost text, as every edit does)."
  (let* ((ghost diffusion-lsp--ghost)
         (typed (buffer-substring-no-properties (overlay-start ghost) (point)))
         (after (- (marker-position (overlay-get ghost 'diffusion-lsp-end)) (point)))
         (text (overlay-get ghost 'diffusion-lsp-text))
         (rest (and (string-prefix-p typed text) (substring text (length typed))))
         (piece (and rest (diffusion-lsp--next-piece rest unit))))
    (if (or (null piece) (string= piece rest))
        (diffusion-lsp-inline-accept)
      (insert piece)
      (let ((left (substring rest (length piece))))
        (diffusion-lsp--put-ghost (point) (+ (point) (max 0 after)) left left)))))

(defun diffusion-lsp-inline-accept-word ()
  "Insert the next word of the ghost text; the rest stays shown.
Without ghost text, move forward a word."
  (interactive)
  (if (and diffusion-lsp--ghost (overlay-buffer diffusion-lsp--ghost))
      (diffusion-lsp--accept-part 'word)
    (forward-word)))

(defun diffusion-lsp-inline-accept-line ()
  "Insert the rest of the ghost text's line, or its next line.
The rest stays shown.  Without ghost text, move to the end of the line."
  (interactive)
  (if (and diffusion-lsp--ghost (overlay-buffer diffusion-lsp--ghost))
      (diffusion-lsp--accept-part 'line)
    (move-end-of-line 1)))

(defun diffusion-lsp--first-item (answer)
  "The first inline completion item of ANSWER (a list, an array or nil)."
  (seq-first (if (vectorp answer) answer (plist-get answer :items))))

(defun diffusion-lsp--show (generation tick answer)
  "Show ANSWER's first item as ghost text at point, unless it is stale.
GENERATION and TICK identify the request it answers."
  (if (or (/= generation diffusion-lsp--generation)
          (/= tick (buffer-chars-modified-tick)))
      (cl-incf diffusion-lsp--stale-answers)
    (when-let* ((item (diffusion-lsp--first-item answer))
                (insert-text (plist-get item :insertText))
                (text (if (stringp insert-text) insert-text (plist-get insert-text :value)))
                (region (if-let ((range (plist-get item :range)))
                            (eglot--range-region range)
                          (cons (point) (point))))
                (typed (and (<= (car region) (point) (cdr region))
                            (buffer-substring-no-properties (car region) (point))))
                ((string-prefix-p typed text))
                (shown (substring text (length typed)))
                ((not (string-empty-p shown))))
      (diffusion-lsp--put-ghost (car region) (cdr region) text shown))))

(defun diffusion-lsp--put-ghost (beg end text shown)
  "Show SHOWN as ghost text; TAB will replace BEG..END with TEXT."
  (diffusion-lsp-inline-dismiss)
  (let ((ghost (make-overlay beg beg nil nil t))
        (display (copy-sequence shown)))
    (put-text-property 0 (length display) 'face 'diffusion-lsp-ghost display)
    (put-text-property 0 1 'cursor t display) ; the cursor stays before the ghost text
    (overlay-put ghost 'after-string display)
    (overlay-put ghost 'diffusion-lsp-text text)
    (overlay-put ghost 'diffusion-lsp-end (copy-marker end t))
    (setq diffusion-lsp--ghost ghost
          diffusion-lsp--ghost-active t)))

;;;###autoload
(defun diffusion-lsp-inline-complete (&optional automatic)
  "Ask the server for an inline completion at point and show it as ghost text.
AUTOMATIC non-nil sends triggerKind Automatic (one candidate) instead of
Invoked.  Answers to earlier requests are dropped, and the server stops
the fill it was running for this buffer."
  (interactive)
  (let ((server (diffusion-lsp--server))
        (buffer (current-buffer))
        (generation (cl-incf diffusion-lsp--generation)))
    (eglot--signal-textDocument/didChange)
    (diffusion-lsp--clear-draft)
    (setq diffusion-lsp--pending t)
    (let* ((tick (buffer-chars-modified-tick))
           (done (lambda ()
                   (when (= generation diffusion-lsp--generation)
                     (setq diffusion-lsp--pending nil)
                     (diffusion-lsp--clear-draft))))
           (sent (jsonrpc-async-request
                  server :textDocument/inlineCompletion
                  (append (eglot--TextDocumentPositionParams)
                          (list :context (list :triggerKind (if automatic 2 1))))
                  :success-fn (lambda (answer)
                                (when (buffer-live-p buffer)
                                  (with-current-buffer buffer
                                    (funcall done)
                                    (diffusion-lsp--show generation tick answer))))
                  :error-fn (lambda (error)
                              (when (buffer-live-p buffer)
                                (with-current-buffer buffer
                                  (when (= generation diffusion-lsp--generation)
                                    (funcall done)
                                    (message "diffusion-lsp: inline completion failed: %s"
                                             (plist-get error :message))))))
                  :timeout-fn (lambda ()
                                (when (buffer-live-p buffer)
                                  (with-current-buffer buffer (funcall done))))
                  :timeout diffusion-lsp-request-timeout)))
      ;; jsonrpc returns (ID TIMER): drafts of other requests are not shown
      (when (and (eq diffusion-lsp--pending t) (integerp (car-safe sent)))
        (setq diffusion-lsp--pending (car sent))))))

(defun diffusion-lsp--pre-command ()
  "Dismiss the ghost text (and forget the pending request) on the next command."
  (unless (memq this-command diffusion-lsp-inline-keep-commands)
    (cl-incf diffusion-lsp--generation)
    (setq diffusion-lsp--pending nil)
    (diffusion-lsp-inline-dismiss)))

(defun diffusion-lsp--after-change (&rest _)
  "Dismiss the ghost text when the buffer changes (the pending fill is stale)."
  (setq diffusion-lsp--pending nil)
  (diffusion-lsp-inline-dismiss))

(defun diffusion-lsp--post-command ()
  "After a command that edited the buffer, ask for a fill once Emacs is idle."
  (let ((tick (buffer-chars-modified-tick)))
    (when (and diffusion-lsp-inline-idle-delay
               (not (equal tick diffusion-lsp--last-tick))
               (not (memq this-command diffusion-lsp-inline-keep-commands))
               (not (use-region-p)))
      (when diffusion-lsp--idle-timer
        (cancel-timer diffusion-lsp--idle-timer))
      (let ((buffer (current-buffer)) (point (point)))
        (setq diffusion-lsp--idle-timer
              (run-with-idle-timer
               diffusion-lsp-inline-idle-delay nil
               (lambda ()
                 (when (and (buffer-live-p buffer) (eq buffer (current-buffer)))
                   (setq diffusion-lsp--idle-timer nil)
                   (when (and diffusion-lsp-inline-mode (= point (point))
                              (cl-typep (eglot-current-server) 'diffusion-lsp-server))
                     (diffusion-lsp-inline-complete t))))))))
    (setq diffusion-lsp--last-tick tick)))

;;;###autoload
(define-minor-mode diffusion-lsp-inline-mode
  "Show diffusion-lsp's inline completion as ghost text after point.
The fill is asked for when Emacs is idle after an edit (see
`diffusion-lsp-inline-idle-delay') or with `diffusion-lsp-inline-complete'.
TAB inserts it; any other command, or an edit, dismisses it."
  :lighter " ✦"
  (if diffusion-lsp-inline-mode
      (progn
        (add-hook 'pre-command-hook #'diffusion-lsp--pre-command nil t)
        (add-hook 'post-command-hook #'diffusion-lsp--post-command nil t)
        (add-hook 'after-change-functions #'diffusion-lsp--after-change nil t)
        (setq diffusion-lsp--last-tick (buffer-chars-modified-tick)))
    (remove-hook 'pre-command-hook #'diffusion-lsp--pre-command t)
    (remove-hook 'post-command-hook #'diffusion-lsp--post-command t)
    (remove-hook 'after-change-functions #'diffusion-lsp--after-change t)
    (when diffusion-lsp--idle-timer
      (cancel-timer diffusion-lsp--idle-timer)
      (setq diffusion-lsp--idle-timer nil))
    (cl-incf diffusion-lsp--generation)
    (setq diffusion-lsp--pending nil)
    (diffusion-lsp-inline-dismiss)))

(defun diffusion-lsp-inline-mode-maybe ()
  "Turn `diffusion-lsp-inline-mode' on where diffusion-lsp manages the buffer.
Off elsewhere, and when eglot stops managing it: for
`eglot-managed-mode-hook', which runs on both."
  (diffusion-lsp-inline-mode
   (if (and (eglot-managed-p) (cl-typep (eglot-current-server) 'diffusion-lsp-server)) 1 -1)))

(add-to-list 'emulation-mode-map-alists 'diffusion-lsp--emulation-alist)

;;;###autoload
(define-minor-mode diffusion-lsp-eglot-mode
  "Use diffusion-lsp as eglot's server for `diffusion-lsp-major-modes'.
On, an entry goes first in `eglot-server-programs' for those modes:
eglot runs one server per buffer, so they leave the servers they had.
Off, the entry is removed.  Loading the package changes nothing until
this mode is on."
  :global t
  :group 'diffusion-lsp
  (if diffusion-lsp-eglot-mode
      (progn
        (diffusion-lsp--register)
        (advice-add 'eglot-completion-at-point :filter-return #'diffusion-lsp--completion-at-point))
    (setq eglot-server-programs (cl-remove #'diffusion-lsp--contact eglot-server-programs :key #'cdr))
    (advice-remove 'eglot-completion-at-point #'diffusion-lsp--completion-at-point)))

(provide 'diffusion-lsp)
;;; diffusion-lsp.el ends here
