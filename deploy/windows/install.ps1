<#
.SYNOPSIS
    Install se-exporter as a Windows service on an Azure VM or scale-set instance (also the Custom Script Extension).

.DESCRIPTION
    Installs Python (from the installer given, unless one is already there), creates a virtualenv in the install
    folder from the offline wheelhouse that `make windows-wheels` builds (no package index is contacted), installs
    the WinSW service wrapper with se-exporter.xml, locks the state folder down to SYSTEM, Administrators and the
    service account, opens the metrics port to the scrapers' addresses only, starts the service and waits for
    /healthz. The wheelhouse is trusted by its SHA-256 given apart from it (-Sha256: the line `make windows-wheels`
    prints); an archive with any other hash is refused before anything is changed.

    Running it again with another wheelhouse upgrades in place: each wheelhouse gets a virtualenv of its own,
    releases\<version>-<hash prefix> in the install folder, built beside the running one; the service is then
    pointed at the new one and restarted, and the old one is removed only once the new one answers /healthz. If it
    does not, the service is pointed back at the old one, restarted, and the script fails. The state folder (spool,
    open lifecycles, forwarding sequence) is kept. -Uninstall stops and removes the service, its firewall rule and
    the install folder, and keeps the state folder unless -Purge is given too.

    Every file it needs sits beside it (the Custom Script Extension downloads its fileUris into one folder):
        install.ps1, se-exporter.xml, WinSW-x64.exe (WinSW 3), windows-wheels.zip, and a python-3.11.x-amd64.exe
        (only if Python 3.11 is not installed yet).

    Event Hubs is reached with the VM's managed identity (role Azure Event Hubs Data Sender): no key or connection
    string is taken, stored or logged by this script.

.EXAMPLE
    powershell -ExecutionPolicy Bypass -File install.ps1 -Sha256 <hash> -EventHubNamespace myns.servicebus.windows.net `
        -EventHubName scheduled-events -ScrapeFrom 10.0.0.0/16

.EXAMPLE
    powershell -ExecutionPolicy Bypass -File install.ps1 -Uninstall [-Purge]
#>
[CmdletBinding()]
param(
    # The wheelhouse: dist/windows-wheels.zip from `make windows-wheels`.
    [string] $Wheels = (Join-Path $PSScriptRoot 'windows-wheels.zip'),
    # Its SHA-256, from the line `make windows-wheels` prints (published apart from the archive).
    [string] $Sha256 = '',
    # The Python installer from python.org, used only when $PythonExe does not exist yet.
    [string] $PythonInstaller = (Get-ChildItem -Path $PSScriptRoot -Filter 'python-3.11.*-amd64.exe' -ErrorAction SilentlyContinue |
        Select-Object -First 1 -ExpandProperty FullName),
    [string] $PythonExe = (Join-Path $env:ProgramFiles 'Python311\python.exe'),
    # WinSW 3 (x64), renamed to se-exporter.exe in the install folder.
    [string] $WinSW = (Join-Path $PSScriptRoot 'WinSW-x64.exe'),
    [string] $InstallDir = (Join-Path $env:ProgramFiles 'se-exporter'),
    [string] $StateDir = (Join-Path $env:ProgramData 'se-exporter'),
    [ValidateRange(1, 65535)] [int] $Port = 10169,
    # Who may scrape /metrics through Windows Firewall: addresses, subnets or keywords such as LocalSubnet.
    [string[]] $ScrapeFrom = @('LocalSubnet'),
    # Event Hubs with the managed identity (optional): namespace host, hub, and the user-assigned identity's client id.
    [string] $EventHubNamespace = '',
    [string] $EventHubName = '',
    [string] $ClientId = '',
    # OTLP/HTTP endpoint for traces (optional), e.g. http://otel-collector.internal:4318
    [string] $OtlpEndpoint = '',
    # The longest interval anything scrapes /metrics at, when longer than se-exporter's default (2m), e.g. 5m
    # (--max-scrape-interval: a new counter series shows 0 that long, so that increase() sees its first count).
    [string] $MaxScrapeInterval = '',
    # Seconds a new release has to answer /healthz before it is rolled back.
    [ValidateRange(1, 3600)] [int] $HealthTimeout = 60,
    # Remove the service, its firewall rule and the install folder instead (the state folder too with -Purge).
    [switch] $Uninstall,
    [switch] $Purge
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'
$ServiceName = 'se-exporter'

function Assert-Administrator {
    $principal = [Security.Principal.WindowsPrincipal][Security.Principal.WindowsIdentity]::GetCurrent()
    if (-not $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)) {
        throw 'install.ps1 must run as an administrator (the Custom Script Extension runs as SYSTEM).'
    }
}

function Invoke-Checked {
    param([string] $FilePath, [string[]] $Arguments)
    & $FilePath @Arguments
    if ($LASTEXITCODE -ne 0) { throw "$FilePath $($Arguments -join ' ') failed with exit code $LASTEXITCODE" }
}

function Install-Python {
    if (Test-Path -LiteralPath $PythonExe) { return }
    if (-not $PythonInstaller -or -not (Test-Path -LiteralPath $PythonInstaller)) {
        throw "No Python at $PythonExe and no python-3.11.*-amd64.exe installer beside install.ps1."
    }
    $target = Split-Path -Parent $PythonExe
    $process = Start-Process -FilePath $PythonInstaller -Wait -PassThru -ArgumentList @(
        '/quiet', 'InstallAllUsers=1', 'PrependPath=0', 'Include_test=0', 'Include_launcher=0', 'Shortcuts=0',
        "TargetDir=$target")
    if ($process.ExitCode -ne 0) { throw "The Python installer failed with exit code $($process.ExitCode)" }
}

function Get-CurrentRelease {
    # The release the installed service configuration runs (its executable is <release>\Scripts\python.exe), or ''.
    $installed = Join-Path $InstallDir 'se-exporter.xml'
    if (-not (Test-Path -LiteralPath $installed)) { return '' }
    [xml] $config = Get-Content -Raw -LiteralPath $installed
    return Split-Path -Leaf (Split-Path -Parent (Split-Path -Parent $config.service.executable))
}

function Install-Release {
    # A virtualenv of its own for this wheelhouse, beside the one the service runs (whose files are in use).
    if ($Sha256 -notmatch '^[0-9a-fA-F]{64}$') {
        throw 'Give the wheelhouse''s SHA-256 with -Sha256 (the line make windows-wheels prints).'
    }
    if (-not (Test-Path -LiteralPath $Wheels -PathType Leaf)) { throw "No wheelhouse at $Wheels (windows-wheels.zip)." }
    $actual = (Get-FileHash -Algorithm SHA256 -LiteralPath $Wheels).Hash.ToLowerInvariant()
    if ($actual -ne $Sha256.ToLowerInvariant()) {
        throw "$Wheels has SHA-256 $actual, not the $Sha256 given: refused, nothing changed."
    }
    $source = Join-Path $env:TEMP 'se-exporter-wheels'
    if (Test-Path -LiteralPath $source) { Remove-Item -LiteralPath $source -Recurse -Force }
    Expand-Archive -LiteralPath $Wheels -DestinationPath $source
    $own = Get-ChildItem -LiteralPath $source -Filter 'se_exporter-*.whl' | Select-Object -First 1
    if (-not $own) { throw "No se-exporter wheel in $Wheels." }
    $release = '{0}-{1}' -f $own.Name.Split('-')[1], $actual.Substring(0, 12)
    if ($release -eq (Get-CurrentRelease)) { return $release }
    $venv = Join-Path $InstallDir "releases\$release"
    if (Test-Path -LiteralPath $venv) { Remove-Item -LiteralPath $venv -Recurse -Force }  # an attempt that never ran
    New-Item -ItemType Directory -Force -Path (Join-Path $InstallDir 'releases') | Out-Null
    # Out-Host: what pip and venv print is shown, not returned with the release's name.
    Invoke-Checked $PythonExe @('-m', 'venv', $venv) | Out-Host
    # Offline, from the wheelhouse only: the exact versions the suite tested (requirements/runtime.txt), each wheel
    # checked against the hash its requirements.txt names, nothing fetched at install time.
    Invoke-Checked (Join-Path $venv 'Scripts\python.exe') @(
        '-m', 'pip', 'install', '--no-index', '--find-links', $source, '--disable-pip-version-check',
        '--require-hashes', '-r', (Join-Path $source 'requirements.txt')) | Out-Host
    Invoke-Checked (Join-Path $venv 'Scripts\python.exe') @('-m', 'se_exporter', '--help') | Out-Null
    return $release
}

function Set-StateFolderAcl {
    New-Item -ItemType Directory -Force -Path $StateDir | Out-Null
    New-Item -ItemType Directory -Force -Path (Join-Path $StateDir 'logs') | Out-Null
    # Well-known SIDs, so the script works whatever the display language: SYSTEM, Administrators, LOCAL SERVICE.
    $system = New-Object Security.Principal.SecurityIdentifier 'S-1-5-18'
    $admins = New-Object Security.Principal.SecurityIdentifier 'S-1-5-32-544'
    $service = New-Object Security.Principal.SecurityIdentifier 'S-1-5-19'
    $inherit = [Security.AccessControl.InheritanceFlags]'ContainerInherit, ObjectInherit'
    $none = [Security.AccessControl.PropagationFlags]::None
    $allow = [Security.AccessControl.AccessControlType]::Allow
    $acl = New-Object Security.AccessControl.DirectorySecurity
    $acl.SetAccessRuleProtection($true, $false)  # no inherited entries: Users get nothing
    $acl.SetOwner($admins)
    foreach ($rule in @(
            (New-Object Security.AccessControl.FileSystemAccessRule $system, 'FullControl', $inherit, $none, $allow),
            (New-Object Security.AccessControl.FileSystemAccessRule $admins, 'FullControl', $inherit, $none, $allow),
            (New-Object Security.AccessControl.FileSystemAccessRule $service, 'Modify', $inherit, $none, $allow))) {
        $acl.AddAccessRule($rule)
    }
    Set-Acl -LiteralPath $StateDir -AclObject $acl
}

function Write-ServiceConfig {
    param([string] $Release)
    [xml] $config = Get-Content -Raw -LiteralPath (Join-Path $PSScriptRoot 'se-exporter.xml')
    $settings = [ordered]@{
        'SE_EXPORTER_LISTEN'              = ":$Port"
        'SE_EXPORTER_EVENTHUB_NAMESPACE'  = $EventHubNamespace
        'SE_EXPORTER_EVENTHUB_NAME'       = $EventHubName
        'SE_EXPORTER_EVENTHUB_CLIENT_ID'  = $ClientId
        'OTEL_EXPORTER_OTLP_ENDPOINT'     = $OtlpEndpoint
        'SE_EXPORTER_MAX_SCRAPE_INTERVAL' = $MaxScrapeInterval
    }
    foreach ($name in $settings.Keys) {
        if (-not $settings[$name]) { continue }
        $element = $config.service.SelectSingleNode("env[@name='$name']")
        if (-not $element) {
            $element = $config.CreateElement('env')
            $element.SetAttribute('name', $name)
            $config.service.InsertBefore($element, $config.service.SelectSingleNode('serviceaccount')) | Out-Null
        }
        $element.SetAttribute('value', $settings[$name])
    }
    $config.service.executable = Join-Path $InstallDir "releases\$Release\Scripts\python.exe"
    $config.service.arguments = "-m se_exporter run --state-dir `"$StateDir`""
    $config.service.workingdirectory = $StateDir
    $config.service.logpath = (Join-Path $StateDir 'logs')
    $config.Save((Join-Path $InstallDir 'se-exporter.xml'))
}

function Switch-Service {
    # Points the service at a release and (re)starts it; the wrapper re-reads its configuration on every start.
    param([string] $Release)
    $wrapper = Join-Path $InstallDir 'se-exporter.exe'
    $installed = [bool] (Get-Service -Name $ServiceName -ErrorAction SilentlyContinue)
    if ($installed) {
        Invoke-Checked $wrapper @('stop')  # Ctrl+C to se-exporter: the orderly stop, spool kept
    }
    Copy-Item -LiteralPath $WinSW -Destination $wrapper -Force  # free to replace while the service is stopped
    Write-ServiceConfig -Release $Release
    if (-not $installed) {
        Invoke-Checked $wrapper @('install')
    }
    Invoke-Checked $wrapper @('start')
}

function Remove-Service {
    $wrapper = Join-Path $InstallDir 'se-exporter.exe'
    if (Get-Service -Name $ServiceName -ErrorAction SilentlyContinue) {
        Invoke-Checked $wrapper @('stop')
        Invoke-Checked $wrapper @('uninstall')
    }
    Get-NetFirewallRule -Name 'se-exporter-metrics' -ErrorAction SilentlyContinue | Remove-NetFirewallRule
    if (Test-Path -LiteralPath $InstallDir) { Remove-Item -LiteralPath $InstallDir -Recurse -Force }
    if ($Purge -and (Test-Path -LiteralPath $StateDir)) { Remove-Item -LiteralPath $StateDir -Recurse -Force }
    if ($Purge) { Write-Output 'se-exporter removed, with its state' }
    else { Write-Output "se-exporter removed; kept $StateDir (state): -Purge removes it" }
}

function Open-MetricsPort {
    $rule = 'se-exporter-metrics'
    Get-NetFirewallRule -Name $rule -ErrorAction SilentlyContinue | Remove-NetFirewallRule
    New-NetFirewallRule -Name $rule -DisplayName "se-exporter /metrics (TCP $Port)" -Direction Inbound -Action Allow `
        -Protocol TCP -LocalPort $Port -RemoteAddress $ScrapeFrom -Profile Any | Out-Null
}

function Test-Healthy {
    $deadline = (Get-Date).AddSeconds($HealthTimeout)
    while ((Get-Date) -lt $deadline) {
        try {
            $answer = Invoke-WebRequest -UseBasicParsing -TimeoutSec 5 -Uri "http://127.0.0.1:$Port/healthz"
            if ($answer.StatusCode -eq 200) { return $true }
        } catch { Start-Sleep -Seconds 1 }
    }
    return $false
}

function Complete-Upgrade {
    # The new release answers: the others go. It does not: back to the previous one, and fail.
    param([string] $Release, [string] $Previous)
    $releases = Join-Path $InstallDir 'releases'
    if (Test-Healthy) {
        Get-ChildItem -LiteralPath $releases -Directory | Where-Object { $_.Name -ne $Release } |
            Remove-Item -Recurse -Force
        Write-Output "se-exporter $Release is running: http://127.0.0.1:$Port/metrics"
        return
    }
    $logs = Join-Path $StateDir 'logs'
    if (-not $Previous -or $Previous -eq $Release) {
        throw "se-exporter $Release did not answer /healthz within $HealthTimeout s; see $logs"
    }
    Switch-Service -Release $Previous
    Remove-Item -LiteralPath (Join-Path $releases $Release) -Recurse -Force
    if (Test-Healthy) {
        throw "se-exporter $Release did not answer /healthz within $HealthTimeout s: rolled back to $Previous, which is running; see $logs"
    }
    throw "se-exporter $Release did not answer /healthz within $HealthTimeout s; rolled back to $Previous, which does not answer either; see $logs"
}

Assert-Administrator
if ($Uninstall) {
    Remove-Service
    return
}
Install-Python
$previous = Get-CurrentRelease
$release = Install-Release
Set-StateFolderAcl
Switch-Service -Release $release
Open-MetricsPort
Complete-Upgrade -Release $release -Previous $previous
